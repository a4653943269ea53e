// Who writes: actor and heartbeat-owner strings, `<role>:<host>:<pid>:<incarnation>`.
// The incarnation (random per process start, per worker thread) keeps two starts of one
// container apart: in a container every process is pid 1 on the same host name, and owner
// ids that repeat across restarts hide stuck work (DESIGN §6).

import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';

const INCARNATION = randomBytes(4).toString('hex');

/**
 * This process's actor id for `role` (`worker`, `route`, `host`, ...).
 * @param {string} [role]
 * @returns {string}
 */
export function actorId(role = 'worker') {
  if (!/^[a-z][a-z0-9_-]*$/.test(role)) {
    throw new TypeError(`actorId: role must be a lower-case word, got ${JSON.stringify(role)}`);
  }
  return `${role}:${hostname()}:${process.pid}:${INCARNATION}`;
}
