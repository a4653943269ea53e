// A heartbeat timer: `callwarden.heartbeat` every `everyMs` while the host's code runs
// (its create, its poll loop, its sync call), never two at once, and always stopped.
// A beat that fails (the database is down) is reported and the next one is tried: a
// heartbeat is projection-only and never ends a call. A beat answering false (the call
// ended, or its result is recorded) stops the timer and calls `onLost`.

/**
 * @typedef {Object} BeatTarget
 * @property {(args: {jobId: string, owner: string, progress?: number | null})
 *   => Promise<boolean>} heartbeat
 */

/**
 * Run a host's callback from the timer: one that throws must not reject the beat (a
 * rejection nobody awaits ends a Node process); its error goes to stderr instead.
 * @param {() => void} fn
 */
function hostCallback(fn) {
  try {
    fn();
  } catch (err) {
    process.emitWarning(`callwarden Beater: a host callback threw: ${String(err)}`);
  }
}

export class Beater {
  /** @type {ReturnType<typeof setTimeout> | null} */
  #timer = null;
  /** @type {Promise<void> | null} */
  #inflight = null;
  #stopped = false;
  #lost = false;
  /** The latest progress (0..100) to send with the next beat. @type {number | null} */
  progress = null;

  /**
   * @param {{cw: BeatTarget, jobId: string, owner: string, everyMs: number,
   *           onLost?: () => void, onError?: (err: unknown, where: string) => void}} options
   */
  constructor({ cw, jobId, owner, everyMs, onLost = () => {}, onError = () => {} }) {
    if (!(Number.isFinite(everyMs) && everyMs > 0)) {
      throw new TypeError(`heartbeatEveryMs must be a positive number, got ${everyMs}`);
    }
    this.cw = cw;
    this.jobId = jobId;
    this.owner = owner;
    this.everyMs = everyMs;
    this.onLost = onLost;
    this.onError = onError;
  }

  /** Whether a beat answered that the call is no longer one to poll. */
  get lost() {
    return this.#lost;
  }

  /** Start beating (the first beat after `everyMs`). */
  start() {
    this.#schedule();
    return this;
  }

  #schedule() {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#inflight = this.#beat().finally(() => {
        this.#inflight = null;
        this.#schedule();
      });
    }, this.everyMs);
  }

  async #beat() {
    try {
      const progress = this.progress === null ? null
        : Math.max(0, Math.min(100, Math.round(this.progress)));
      const alive = await this.cw.heartbeat({ jobId: this.jobId, owner: this.owner, progress });
      if (alive === false && !this.#stopped) {
        this.#stopped = true;
        this.#lost = true;
        hostCallback(this.onLost);
      }
    } catch (err) {
      hostCallback(() => this.onError(err, 'heartbeat'));
    }
  }

  /** Stop beating; waits for a beat in flight (so none is written after this returns). */
  async stop() {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    if (this.#inflight !== null) await this.#inflight;
  }
}
