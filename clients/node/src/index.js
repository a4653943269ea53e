// callwarden for non-Python hosts: the host API (migration 0014_host_api.sql) over pg or
// supabase-js, and the loops a worker or a sync route wraps its provider code in.
// See docs/node.md.

export { actorId } from './actor.js';
export { Beater } from './beat.js';
export { Callwarden, withoutNul } from './client.js';
export { FUNCTIONS, HOST_API_VERSION, SCHEMA } from './contract.js';
export {
  CallwardenError,
  CreateRefused,
  DatabaseUnavailable,
  IllegalTransition,
  InvalidArgument,
  JobExists,
  JobNotFound,
  KindMismatch,
  PermissionDenied,
  TaskAlreadyClaimed,
  TaskIdConflict,
  classify,
} from './errors.js';
export { runSync, runTask, wait } from './run.js';
export { pgTransport, rpcTransport } from './transport.js';
