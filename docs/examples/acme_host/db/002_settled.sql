-- The balance follows each settlement. callwarden settles a reservation with one UPDATE of
-- its usage_logs row, from 'reserved' to 'committed' (credits_charged: the charge) or
-- 'refunded' (credits_charged: 0), in the transaction that ends the call, whoever ends it
-- (a worker, the reconciler, a webhook, a cancel): the balance gets back what was held and
-- not charged, exactly once, or not at all if that transaction rolls back. SECURITY DEFINER:
-- callwarden's runtime role needs no grant on accounts. (PostgreSQL 14+ for OR REPLACE.)
CREATE OR REPLACE FUNCTION acme_settled() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public AS $$ BEGIN
    UPDATE accounts SET balance = balance + NEW.credits_reserved - NEW.credits_charged
        WHERE user_id = NEW.user_id::text;
    RETURN NULL; END $$;
CREATE OR REPLACE TRIGGER acme_settled AFTER UPDATE OF status ON usage_logs FOR EACH ROW
    WHEN (OLD.status = 'reserved' AND NEW.status <> 'reserved') EXECUTE FUNCTION acme_settled();
