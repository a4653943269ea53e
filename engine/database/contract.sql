-- The host contract's reads (callwarden check; callwarden.database.contract).

-- name: check_host_columns
-- The columns of the host tables as the engine's statements find them: through the
-- search_path (to_regclass), a domain read as its base type, a length limit kept.
SELECT c.relname::text AS table_name, a.attname::text AS column_name,
       CASE WHEN t.typtype = 'd' THEN b.typname ELSE t.typname END::text AS udt_name,
       CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END AS is_nullable,
       pg_get_expr(d.adbin, d.adrelid) AS column_default,
       CASE WHEN a.atttypmod > 4
                 AND (CASE WHEN t.typtype = 'd' THEN b.typname ELSE t.typname END)
                     IN ('varchar', 'bpchar')
            THEN a.atttypmod - 4 END AS max_chars,
       format_type(a.atttypid, a.atttypmod) AS declared
  FROM unnest(ARRAY['jobs', 'usage_logs', 'assets', 'workflow_executions']) AS n(name)
  JOIN pg_class c ON c.oid = to_regclass(n.name)
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_type b ON b.oid = t.typbasetype
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum;

-- name: check_status_constraints
-- The CHECK constraints on jobs.status: the table's, and its domain's if it is one.
SELECT c.conname::text AS name, pg_get_constraintdef(c.oid) AS definition
  FROM pg_constraint c
 WHERE c.contype = 'c'
   AND (c.conrelid = to_regclass('jobs')
        AND pg_get_constraintdef(c.oid) ~ '\mstatus\M'
        OR c.contypid = (SELECT a.atttypid FROM pg_attribute a
                          WHERE a.attrelid = to_regclass('jobs') AND a.attname = 'status'
                            AND NOT a.attisdropped));
