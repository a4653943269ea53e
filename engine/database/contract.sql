-- The host contract's reads (callwarden check; callwarden.database.contract).

-- name: check_host_columns
SELECT table_name::text, column_name::text, udt_name::text, is_nullable::text,
       column_default::text
  FROM information_schema.columns
 WHERE table_schema = current_schema()
   AND table_name IN ('jobs', 'usage_logs', 'assets', 'workflow_executions');

-- name: check_status_constraints
SELECT c.conname::text AS name, pg_get_constraintdef(c.oid) AS definition
  FROM pg_constraint c
 WHERE c.conrelid = to_regclass('jobs') AND c.contype = 'c'
   AND pg_get_constraintdef(c.oid) ~ '\mstatus\M';
