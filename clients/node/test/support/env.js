// What the tests are given (tests/acceptance/test_node_host.py sets it): the database,
// Redis, the provider simulator, and the Python that runs callwarden's own CLI.

import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import pg from 'pg';

/** The repository's root (callwarden's CLI runs from there). */
export const ROOT = fileURLToPath(new URL('../../../../', import.meta.url));

/**
 * @param {string} name
 * @returns {string}
 */
export function need(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run these tests through `
                    + 'tests/acceptance/test_node_host.py, or set it (see docs/node.md)');
  }
  return value;
}

/**
 * A pool on DATABASE_URL (an already migrated database).
 * @param {number} [max]
 */
export function pool(max = 5) {
  const p = new pg.Pool({ connectionString: need('DATABASE_URL'), max });
  p.on('error', () => {}); // an idle client cut by the server: the next query reconnects
  return p;
}

/**
 * `python -m callwarden.cli ...args` (CALLWARDEN_PYTHON, else python3) with this
 * process's environment plus `env`; its exit code and output.
 * @param {string[]} args
 * @param {Record<string, string>} [env]
 * @param {number} [timeoutMs]
 * @returns {Promise<{code: number | null, stdout: string, stderr: string}>}
 */
export function callwarden(args, env = {}, timeoutMs = 60_000) {
  const python = process.env.CALLWARDEN_PYTHON || 'python3';
  return new Promise((resolve, reject) => {
    const child = spawn(python, ['-m', 'callwarden.cli', ...args], {
      cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => { stdout += d; });
    child.stderr.on('data', (d) => { stderr += d; });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`callwarden ${args.join(' ')}: still running after ${timeoutMs} ms`));
    }, timeoutMs);
    child.on('error', (err) => { clearTimeout(timer); reject(err); });
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }); });
  });
}

/**
 * `callwarden verify`: the projection columns equal the fold of the log, for every job.
 */
export async function verify() {
  const { code, stdout, stderr } = await callwarden(['verify', '--json']);
  if (code !== 0) throw new Error(`callwarden verify exited ${code}:\n${stdout}\n${stderr}`);
  return stdout;
}
