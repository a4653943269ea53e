"""ElevenLabs (``elevenlabs-async`` dubbing, ``elevenlabs-sync``): ``operations`` (each
operation's request and answer: pure), ``wire`` (errors and multipart bodies: pure),
``webhook`` (the signature and delivery bodies: pure), ``client`` (the only I/O)."""
