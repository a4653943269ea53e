"""KIE.ai (the task families and ``kie-llm``): ``requests`` (pure), ``wire`` (task
answers and errors: pure), ``llm`` (``kie-llm`` answers: pure), ``webhook`` (the callback
signature and body: pure), ``client`` (the only I/O)."""
