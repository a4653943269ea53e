// Waiting on a condition, never on time alone: `until(check)` polls `check` every
// `everyMs` until it answers something truthy, and fails after `timeoutMs` naming `what`.

/**
 * @template T
 * @param {string} what
 * @param {() => Promise<T | null | undefined | false> | T | null | undefined | false} check
 * @param {{timeoutMs?: number, everyMs?: number}} [options]
 * @returns {Promise<T>}
 */
export async function until(what, check, { timeoutMs = 20_000, everyMs = 50 } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const value = await check();
      if (value) return value;
      last = value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${
        last instanceof Error ? last.message : JSON.stringify(last)})`);
    }
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}
