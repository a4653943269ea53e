// The host's own KIE client, written the way the seed's backend/src/providers/kie/client.ts
// splits it (createKieTask / pollKieTask / runKieTask): KIE's HTTP-200 envelope with the
// real status in `code`, the market jobs API. It knows nothing of callwarden; the worker
// wraps it (test/worker.js).

const UA = 'callwarden-node-tests/0.1';

export class KieTaskFailed extends Error {
  /**
   * @param {string} message
   * @param {string | null} code
   */
  constructor(message, code) {
    super(message);
    this.name = 'KieTaskFailed';
    this.code = code;
  }
}

export class KieTaskNotFound extends Error {}

/**
 * @typedef {Object} KieResult
 * @property {string} taskId
 * @property {string[]} resultUrls
 * @property {number | null} costTime
 */

/**
 * @typedef {{status: 'running', progress?: number}
 *   | {status: 'succeeded', resultUrls: string[], raw: Record<string, unknown>}
 *   | {status: 'failed', error: string, code?: string}
 *   | {status: 'not_found'}} KiePoll
 */

export class KieClient {
  /**
   * @param {{baseUrl: string, apiKey: string}} options `baseUrl` without `/api/v1`
   */
  constructor({ baseUrl, apiKey }) {
    this.baseUrl = baseUrl.replace(/\/$/, '');
    this.apiKey = apiKey;
  }

  /**
   * @param {string} path
   * @param {RequestInit} [init]
   * @returns {Promise<{code: number, msg: string, data: any}>}
   */
  async #request(path, init = {}) {
    const resp = await fetch(`${this.baseUrl}${path}`, {
      ...init,
      headers: { Authorization: `Bearer ${this.apiKey}`, 'User-Agent': UA,
                 'Content-Type': 'application/json' },
    });
    if (resp.status >= 500 || resp.status === 429) {
      throw new Error(`KIE ${path}: HTTP ${resp.status}`);
    }
    const body = /** @type {{code: number, msg: string, data: any}} */ (await resp.json());
    return body;
  }

  /**
   * POST /api/v1/jobs/createTask; the task id.
   * @param {string} model
   * @param {Record<string, unknown>} input
   * @param {{signal?: AbortSignal}} [options]
   * @returns {Promise<string>}
   */
  async createKieTask(model, input, { signal } = {}) {
    const body = await this.#request('/api/v1/jobs/createTask', {
      method: 'POST', body: JSON.stringify({ model, input }), signal,
    });
    if (body.code !== 200 || typeof body.data?.taskId !== 'string') {
      throw new Error(`KIE createTask: code ${body.code}: ${body.msg}`);
    }
    return body.data.taskId;
  }

  /**
   * One GET /api/v1/jobs/recordInfo.
   * @param {string} taskId
   * @param {{signal?: AbortSignal}} [options]
   * @returns {Promise<KiePoll>}
   */
  async pollOnce(taskId, { signal } = {}) {
    const body = await this.#request(
      `/api/v1/jobs/recordInfo?taskId=${encodeURIComponent(taskId)}`, { signal });
    if (body.code === 422 && /recordInfo is null/.test(body.msg)) return { status: 'not_found' };
    if (body.code !== 200 || body.data === null || typeof body.data !== 'object') {
      throw new Error(`KIE recordInfo: code ${body.code}: ${body.msg}`);
    }
    const data = body.data;
    if (data.state === 'success') {
      const parsed = JSON.parse(data.resultJson || '{}');
      return { status: 'succeeded', resultUrls: parsed.resultUrls ?? [], raw: data };
    }
    if (data.state === 'fail') {
      return { status: 'failed', error: String(data.failMsg ?? 'failed'),
               code: data.failCode === null ? undefined : String(data.failCode) };
    }
    return typeof data.progress === 'number' ? { status: 'running', progress: data.progress }
      : { status: 'running' };
  }

  /**
   * The seed's runKieTask: create -> onTaskCreated -> poll to the end; with the seed's
   * Phase 4 guard, `resumeTaskId` polls that task and never creates.
   * @param {string} model
   * @param {Record<string, unknown>} input
   * @param {{onTaskCreated?: (taskId: string) => Promise<unknown>, resumeTaskId?: string | null,
   *          pollEveryMs?: number, onPoll?: (p: KiePoll, taskId: string) => Promise<void>,
   *          beforeCreate?: () => Promise<void>, afterCreate?: (taskId: string) => Promise<void>}}
   *   [options]
   * @returns {Promise<KieResult>}
   */
  async runKieTask(model, input, options = {}) {
    let taskId = options.resumeTaskId ?? null;
    if (taskId === null) {
      await options.beforeCreate?.();
      taskId = await this.createKieTask(model, input);
      await options.afterCreate?.(taskId);
      await options.onTaskCreated?.(taskId);
    }
    for (;;) {
      const polled = await this.pollOnce(taskId);
      await options.onPoll?.(polled, taskId);
      if (polled.status === 'succeeded') {
        return { taskId, resultUrls: polled.resultUrls,
                 costTime: typeof polled.raw.costTime === 'number' ? polled.raw.costTime : null };
      }
      if (polled.status === 'failed') throw new KieTaskFailed(polled.error, polled.code ?? null);
      if (polled.status === 'not_found') throw new KieTaskNotFound(`KIE task ${taskId} not found`);
      await new Promise((resolve) => setTimeout(resolve, options.pollEveryMs ?? 2_000));
    }
  }
}
