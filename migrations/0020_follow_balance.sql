-- 0020: a host's balance follows each settlement, in one call (issue 41 item 6).
--
-- A host that keeps a balance of its own (a credits column on its users) must learn of
-- every settlement, made in any process: callwarden settles a reservation with exactly one
-- UPDATE of its usage_logs row, from 'reserved' to 'committed' (credits_charged: the
-- charge) or 'refunded' (credits_charged: 0), in the transaction that ends the call, whoever
-- ends it (a worker, the reconciler, a webhook, a cancel, the host API of a Node host). A
-- trigger on that UPDATE sees each settlement once and commits or rolls back with it.
--
-- callwarden.follow_balance(accounts, balance, user_column, held) writes that trigger for
-- the host, from its own migration (`SELECT callwarden.follow_balance('accounts',
-- 'balance', 'user_id');`): the balance column of the row whose user_column is the
-- reservation's user_id gets back what was held and not charged (held => true: the host
-- took the reservation off the balance when it created the job), or loses the charge
-- (held => false: the host took nothing at the order). Called again, it replaces the
-- trigger (another table, another rule); DROP TRIGGER callwarden_balance ON usage_logs
-- stops it.
--
-- The trigger's function, callwarden.balance_follows_settlement(), is written by
-- follow_balance with the host's names in it, as the caller (the host's migration role,
-- which may update its accounts table): SECURITY DEFINER, with an empty search_path, so
-- that callwarden's runtime role needs no grant on the host's table. It runs only as the
-- trigger callwarden_balance on usage_logs (a role that may execute it cannot attach it
-- to a table of its own to move balances). A commit without credits_charged charged the
-- reservation (as the write path reads it); a refund charged nothing. A settlement whose
-- user has no row in the accounts table, or cannot be its key's type, is not refused:
-- the call still ends, and a warning names it.
--
-- follow_balance refuses, creating nothing: a caller that does not own usage_logs or may
-- not update the balance; an unknown column; a balance that is not numeric (real, double
-- precision) since fractions of a credit would be rounded away; a user column that is not
-- unique alone; held => NULL; a trigger callwarden_balance of the host's own. On Citus a
-- trigger on the distributed usage_logs may not write another table: it refuses there,
-- and the host settles its balance from usage_logs.settled_at.

DO $follow$
DECLARE
    host text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = to_regclass('usage_logs'));
    body text := $fn$
CREATE OR REPLACE FUNCTION callwarden.follow_balance(
    accounts regclass, balance name, user_column name, held boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = ''
AS $body$
DECLARE
    types jsonb;
    col name;
    grantee regrole;
    settled text;
    logs constant regclass := '@host@.usage_logs'::regclass;
BEGIN
    IF held IS NULL THEN
        RAISE EXCEPTION 'callwarden.follow_balance: held is true (the order took the '
                        'reservation off the balance) or false (the charge is taken at '
                        'settlement), not NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c
                                                 WHERE c.oid = logs), 'USAGE') THEN
        RAISE EXCEPTION 'callwarden.follow_balance: % does not own %', current_user, logs
            USING ERRCODE = '42501',
                  HINT = 'Call it from the host''s migration, as the role that owns usage_logs.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'callwarden.follow_balance: Citus runs no trigger on the distributed '
                        'usage_logs that writes another table'
            USING ERRCODE = '0A000',
                  HINT = 'Settle the balance from usage_logs.settled_at (docs/embedding.md).';
    END IF;
    SELECT pg_catalog.jsonb_object_agg(a.attname, pg_catalog.format_type(a.atttypid,
                                                                           a.atttypmod))
    INTO types
    FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = accounts AND a.attname IN (balance, user_column) AND a.attnum > 0
      AND NOT a.attisdropped;
    FOREACH col IN ARRAY ARRAY[balance, user_column] LOOP
        IF types IS NULL OR NOT types OPERATOR(pg_catalog.?) col THEN
            RAISE EXCEPTION 'callwarden.follow_balance: % has no column %', accounts, col
                USING ERRCODE = '42703';
        END IF;
    END LOOP;
    IF NOT (types ->> balance IN ('numeric', 'real', 'double precision')
            OR types ->> balance LIKE 'numeric(%') THEN
        RAISE EXCEPTION 'callwarden.follow_balance: %.% is %: a charge in fractions of a '
                        'credit would be rounded away', accounts, balance, types ->> balance
            USING ERRCODE = '42804',
                  HINT = 'Make the column numeric, or write the trigger with your own rounding '
                         '(docs/embedding.md).';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                   JOIN pg_catalog.pg_attribute a
                     ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                   WHERE i.indrelid = accounts AND i.indisunique AND i.indnkeyatts = 1
                     AND i.indpred IS NULL AND a.attname = user_column) THEN
        RAISE EXCEPTION 'callwarden.follow_balance: %.% is not unique: a settlement would '
                        'move the balance of every row of its user', accounts, user_column
            USING ERRCODE = '42P10';
    END IF;
    IF NOT (pg_catalog.has_column_privilege(accounts, balance, 'UPDATE')
            AND pg_catalog.has_column_privilege(accounts, user_column, 'SELECT')) THEN
        RAISE EXCEPTION 'callwarden.follow_balance: % may not update %.%: every settlement '
                        'would fail', current_user, accounts, balance
            USING ERRCODE = '42501';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
               WHERE t.tgrelid = logs AND t.tgname = 'callwarden_balance'
                 AND t.tgfoid IS DISTINCT FROM pg_catalog.to_regprocedure(
                     'callwarden.balance_follows_settlement()')::oid) THEN
        RAISE EXCEPTION 'callwarden.follow_balance: % has a trigger callwarden_balance of '
                        'its own', logs USING ERRCODE = '42710';
    END IF;
    -- the charge: a commit without credits_charged charged the reservation (as the write
    -- path reads it), a refund charged nothing
    settled := pg_catalog.format($settled$
DECLARE
    uid %4$s;
BEGIN
    IF TG_RELID <> '@host@.usage_logs'::regclass OR TG_NAME <> 'callwarden_balance' THEN
        RAISE EXCEPTION 'callwarden.balance_follows_settlement runs only as the trigger '
                        'callwarden_balance on usage_logs' USING ERRCODE = '42501';
    END IF;
    BEGIN
        uid := NEW.user_id;
    EXCEPTION WHEN data_exception THEN
        RAISE WARNING 'callwarden: the settlement of job %% reached no balance (user %% '
                      'cannot be a key of the balance''s table)', NEW.job_id, NEW.user_id;
        RETURN NULL;
    END;
    UPDATE %1$s SET %2$I = %2$I + (%5$s) WHERE %3$I = uid;
    IF NOT FOUND THEN
        RAISE WARNING 'callwarden: the settlement of job %% reached no balance (no row for '
                      'user %%)', NEW.job_id, NEW.user_id;
    END IF;
    RETURN NULL;
END
$settled$,
        accounts, balance, user_column, types ->> user_column,
        CASE WHEN held THEN 'NEW.credits_reserved - ' ELSE '-' END
        || 'CASE WHEN NEW.status = ''committed'' THEN coalesce(NEW.credits_charged, '
           'NEW.credits_reserved) ELSE coalesce(NEW.credits_charged, 0) END');
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION callwarden.balance_follows_settlement() RETURNS trigger '
        'LANGUAGE plpgsql SECURITY DEFINER SET search_path = '''' AS %L', settled);
    -- nobody may create another trigger with it (grant_runtime's loop over callwarden's
    -- functions grants it to a runtime role at the next migrate: its first lines refuse to
    -- run on any table but usage_logs, under any name but callwarden_balance)
    REVOKE ALL ON FUNCTION callwarden.balance_follows_settlement() FROM PUBLIC;
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = 'callwarden.balance_follows_settlement()'::regprocedure
          AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format(
            'REVOKE ALL ON FUNCTION callwarden.balance_follows_settlement() FROM %s', grantee);
    END LOOP;
    DROP TRIGGER IF EXISTS callwarden_balance ON @host@.usage_logs;
    CREATE TRIGGER callwarden_balance AFTER UPDATE OF status ON @host@.usage_logs
        FOR EACH ROW WHEN (OLD.status = 'reserved' AND NEW.status <> 'reserved')
        EXECUTE FUNCTION callwarden.balance_follows_settlement();
END
$body$;
$fn$;
BEGIN
    EXECUTE replace(body, '@host@', quote_ident(host));
END
$follow$;

REVOKE ALL ON FUNCTION callwarden.follow_balance(regclass, name, name, boolean) FROM PUBLIC;
