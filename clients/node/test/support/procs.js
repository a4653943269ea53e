// Worker processes (test/worker.js) as children the test can SIGKILL, SIGSTOP and SIGCONT,
// their JSON-line events collected as they come.

import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { until } from './wait.js';

const WORKER = fileURLToPath(new URL('../worker.js', import.meta.url));

/**
 * @typedef {{event: string, pid: number, jobId?: string, [key: string]: unknown}} WorkerEvent
 */

export class WorkerProcess {
  /** @type {WorkerEvent[]} */
  events = [];
  stderr = '';
  /** @type {number | null} */
  exitCode = null;
  /** @type {string | null} */
  exitSignal = null;

  /**
   * @param {string} name for messages
   * @param {Record<string, string>} env added to this process's environment
   */
  constructor(name, env) {
    this.name = name;
    this.child = spawn(process.execPath, [WORKER], {
      env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let buffered = '';
    this.child.stdout.on('data', (chunk) => {
      buffered += chunk;
      let nl;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        try {
          this.events.push(JSON.parse(line));
        } catch {
          this.stderr += `${line}\n`;
        }
      }
    });
    this.child.stderr.on('data', (chunk) => { this.stderr += chunk; });
    this.exited = new Promise((resolve) => {
      this.child.on('exit', (code, signal) => {
        this.exitCode = code;
        this.exitSignal = signal;
        resolve(undefined);
      });
    });
  }

  get pid() {
    return /** @type {number} */ (this.child.pid);
  }

  /** Its events of one kind. @param {string} event */
  of(event) {
    return this.events.filter((e) => e.event === event);
  }

  /** What it said, for a failure message. */
  log() {
    return `${this.name} (pid ${this.pid}): ${this.events.map((e) => JSON.stringify(e))
      .join('\n')}\n${this.stderr}`;
  }

  /**
   * Wait until `count` events of kind `event` (the worker's log in the error otherwise).
   * @param {string} event
   * @param {number} [count]
   * @param {number} [timeoutMs]
   */
  async saw(event, count = 1, timeoutMs = 20_000) {
    try {
      return await until(`${count} ${event} from ${this.name}`, () => {
        if (this.exitCode !== null || this.exitSignal !== null) {
          throw new Error(`${this.name} exited (${this.exitCode ?? this.exitSignal})`);
        }
        return this.of(event).length >= count ? this.of(event) : null;
      }, { timeoutMs });
    } catch (err) {
      throw new Error(`${/** @type {Error} */ (err).message}\n${this.log()}`);
    }
  }

  /** @param {NodeJS.Signals} signal */
  signal(signal) {
    this.child.kill(signal);
  }

  /** SIGKILL, and wait until it is gone. */
  async kill() {
    if (this.exitCode === null && this.exitSignal === null) this.child.kill('SIGKILL');
    await this.exited;
  }

  /** SIGTERM (BullMQ's close), else SIGKILL after `graceMs`. */
  async stop(graceMs = 5_000) {
    if (this.exitCode !== null || this.exitSignal !== null) return;
    this.child.kill('SIGCONT');
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(timer);
  }
}
