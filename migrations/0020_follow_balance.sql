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
-- that callwarden's runtime role needs no grant on the host's table. Only a role that owns
-- usage_logs may call follow_balance (it creates a trigger there). A settlement whose user
-- has no row in the accounts table is not refused (the call still ends; a warning names
-- it). On Citus a trigger on the distributed usage_logs may not write another table:
-- follow_balance refuses there, and the host settles its balance from the events.

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
    owner oid := (SELECT c.relowner FROM pg_catalog.pg_class c
                  WHERE c.oid = '@host@.usage_logs'::regclass);
BEGIN
    IF NOT pg_catalog.pg_has_role(current_user, owner, 'USAGE') THEN
        RAISE EXCEPTION 'callwarden.follow_balance: % does not own @host@.usage_logs',
            current_user
            USING ERRCODE = '42501',
                  HINT = 'Call it from the host''s migration, as the role that owns usage_logs.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'callwarden.follow_balance: Citus runs no trigger on the distributed '
                        'usage_logs that writes another table'
            USING ERRCODE = '0A000',
                  HINT = 'Settle the balance from the log (docs/embedding.md).';
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
    EXECUTE pg_catalog.format($trigger$
CREATE OR REPLACE FUNCTION callwarden.balance_follows_settlement() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $settled$
BEGIN
    UPDATE %1$s SET %2$I = %2$I + (%3$s)::%4$s WHERE %5$I = NEW.user_id::%6$s;
    IF NOT FOUND THEN
        RAISE WARNING 'callwarden: the settlement of job %% reached no balance (no row '
                      'for user %%)', NEW.job_id, NEW.user_id;
    END IF;
    RETURN NULL;
END
$settled$
$trigger$,
        accounts, balance,
        CASE WHEN held
             THEN 'NEW.credits_reserved - coalesce(NEW.credits_charged, 0)'
             ELSE '-coalesce(NEW.credits_charged, 0)' END,
        types ->> balance, user_column, types ->> user_column);
    REVOKE ALL ON FUNCTION callwarden.balance_follows_settlement() FROM PUBLIC;
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
