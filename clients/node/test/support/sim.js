// The provider simulator's control API (providers/simulator/control.py): its journal of
// every request, read to count the create requests each job caused.

import { need } from './env.js';

/** The simulator's base URL (the KIE URL without its `/kie` prefix). */
export function simBase() {
  return need('CALLWARDEN_KIE_URL').replace(/\/kie\/?$/, '');
}

/**
 * Journal entries of one provider route.
 * @param {string} provider
 * @param {string} route
 * @returns {Promise<Array<{path: string, query: Record<string, string>, body: string,
 *   fault: string | null}>>}
 */
export async function journal(provider, route) {
  const resp = await fetch(`${simBase()}/_sim/journal?provider=${provider}&route=${route}`);
  if (!resp.ok) throw new Error(`simulator journal: HTTP ${resp.status}`);
  return /** @type {any} */ (await resp.json());
}

/**
 * How many KIE create requests named each job (the prompt carries `job:<id>`).
 * @returns {Promise<Map<string, number>>}
 */
export async function kieCreatesPerJob() {
  /** @type {Map<string, number>} */
  const counts = new Map();
  for (const entry of await journal('kie', 'create')) {
    const match = /job:([0-9a-f-]{36})/.exec(entry.body);
    if (match) counts.set(match[1], (counts.get(match[1]) ?? 0) + 1);
  }
  return counts;
}

/**
 * How many KIE polls asked about each task id.
 * @returns {Promise<Map<string, number>>}
 */
export async function kiePollsPerTask() {
  /** @type {Map<string, number>} */
  const counts = new Map();
  for (const entry of await journal('kie', 'poll')) {
    const task = entry.query.taskId;
    if (task) counts.set(task, (counts.get(task) ?? 0) + 1);
  }
  return counts;
}
