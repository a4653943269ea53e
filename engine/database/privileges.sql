-- Who may reach callwarden's objects (engine/cli/check.py, `callwarden check`; issue 39,
-- docs/security.md) and the runtime grant (`callwarden grant`).

-- name: privileges_grant_runtime
-- migration 0011: the runtime role's grants, each statement it ran
SELECT stmt FROM callwarden.grant_runtime(%(role)s::regrole) AS stmt;

-- name: privileges_roles
-- Every role other than superusers and the owner of the schema callwarden (and its
-- members), with what it can reach in callwarden's schema. usage and appends (what makes a
-- role callwarden's runtime) count grants made to the role or a role it belongs to, never
-- PUBLIC's nor what pg_read_all_data / pg_write_all_data (Postgres 14+) give: reads_all
-- says a role has those, reaches lists everything it can reach however it got it, granted
-- what it was granted itself. Citus's shards (name_NNNNNN) are not objects of their own.
WITH own AS (
    SELECT n.oid, n.nspowner, n.nspacl FROM pg_namespace n WHERE n.nspname = 'callwarden'
), objects AS (
    SELECT c.oid, 'table ' || c.relname AS name, 'r' AS kind, c.relacl AS acl
    FROM pg_class c, own
    WHERE c.relnamespace = own.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
      AND c.relname !~ '_[0-9]+$'
    UNION ALL
    SELECT p.oid, 'function ' || p.proname, 'f', p.proacl
    FROM pg_proc p, own
    WHERE p.pronamespace = own.oid
), everyone AS (
    SELECT r.oid, r.rolname,
           coalesce(pg_has_role(r.oid, to_regrole('pg_read_all_data'), 'USAGE'), false)
           OR coalesce(pg_has_role(r.oid, to_regrole('pg_write_all_data'), 'USAGE'), false)
               AS reads_all
    FROM pg_roles r, own
    WHERE NOT r.rolsuper AND NOT pg_has_role(r.oid, own.nspowner, 'USAGE')
      AND r.rolname NOT IN ('pg_read_all_data', 'pg_write_all_data')
)
SELECT e.rolname AS role,
       EXISTS (SELECT 1 FROM own, aclexplode(own.nspacl) a
               WHERE a.privilege_type = 'USAGE' AND a.grantee <> 0
                 AND pg_has_role(e.oid, a.grantee, 'USAGE')) AS usage,
       EXISTS (SELECT 1 FROM pg_class c, aclexplode(c.relacl) a
               WHERE c.oid = to_regclass('callwarden.call_events')
                 AND a.privilege_type = 'INSERT' AND a.grantee <> 0
                 AND pg_has_role(e.oid, a.grantee, 'USAGE')) AS appends,
       e.reads_all,
       array(SELECT o.name FROM objects o
             WHERE (o.kind = 'r' AND has_table_privilege(e.oid, o.oid,
                        'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'))
                OR (o.kind = 'f' AND has_function_privilege(e.oid, o.oid, 'EXECUTE'))
             ORDER BY o.name) AS reaches,
       array(SELECT DISTINCT o.name FROM objects o, aclexplode(o.acl) a
             WHERE a.grantee <> 0 AND pg_has_role(e.oid, a.grantee, 'USAGE')
             ORDER BY o.name) AS granted
FROM everyone e
ORDER BY e.rolname;

-- name: privileges_rls_gaps
-- The host tables under row-level security where a runtime role sees no row: no policy
-- applies to it (0011's grant_runtime makes one), it does not bypass RLS and does not own
-- the table. Enabling RLS after the grant leaves such a gap.
SELECT r.rolname AS role, c.relname AS tbl
FROM pg_roles r, pg_class c
WHERE r.rolname = ANY(%(roles)s::text[])
  AND c.oid IN (to_regclass('jobs'), to_regclass('usage_logs'), to_regclass('assets'),
                to_regclass('workflow_executions'))
  AND c.relrowsecurity AND NOT r.rolbypassrls
  AND NOT pg_has_role(r.oid, c.relowner, 'USAGE')
  AND NOT EXISTS (SELECT 1 FROM pg_policy p
                  WHERE p.polrelid = c.oid
                    AND (0 = ANY(p.polroles)
                         OR EXISTS (SELECT 1 FROM unnest(p.polroles) AS pr (oid)
                                    WHERE pg_has_role(r.oid, pr.oid, 'USAGE'))))
ORDER BY 1, 2;

-- name: privileges_public
-- What PUBLIC (every role, present and future) holds on callwarden's schema and objects.
SELECT 'schema callwarden' AS name
FROM pg_namespace n, aclexplode(n.nspacl) a
WHERE n.nspname = 'callwarden' AND a.grantee = 0
UNION
SELECT 'table ' || c.relname
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.relnamespace = to_regnamespace('callwarden') AND a.grantee = 0
UNION
SELECT 'function ' || p.proname
FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.pronamespace = to_regnamespace('callwarden') AND a.grantee = 0
ORDER BY 1;

-- name: privileges_owner
SELECT pg_get_userbyid(n.nspowner) AS owner FROM pg_namespace n WHERE n.nspname = 'callwarden';

-- name: privileges_guards
-- 0011's guard triggers on the host's tables (absent on Citus, which refuses them).
SELECT count(*) AS n FROM pg_trigger
WHERE tgname IN ('callwarden_guard_update', 'callwarden_guard_insert',
                 'callwarden_guard_settlement', 'callwarden_guard_settlement_insert')
  AND tgrelid IN (to_regclass('jobs'), to_regclass('usage_logs'))
  AND tgenabled <> 'D';
