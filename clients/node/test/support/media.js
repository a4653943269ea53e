// The host's media storage: download each result file and keep it under a key that is a
// function of the job (a repeat overwrites the same file: idempotent, as the seed's R2 keys).

import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/** @typedef {import('../../src/contract.js').StoredMedia} StoredMedia */

/**
 * @param {string} root the host's storage folder
 * @param {string} jobId
 * @param {string[]} urls
 * @returns {Promise<StoredMedia[]>}
 */
export async function storeMedia(root, jobId, urls) {
  /** @type {StoredMedia[]} */
  const stored = [];
  for (const [i, url] of urls.entries()) {
    const resp = await fetch(url);
    if (!resp.ok) throw new Error(`media ${url}: HTTP ${resp.status}`);
    const bytes = Buffer.from(await resp.arrayBuffer());
    const contentType = resp.headers.get('content-type')?.split(';')[0] ?? 'application/octet-stream';
    const key = `node/${jobId}/${i}`;
    const path = join(root, key);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, bytes);
    stored.push({ key, url: `/media/${key}`, content_type: contentType, size: bytes.length });
  }
  return stored;
}
