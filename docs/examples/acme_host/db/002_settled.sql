-- The balance follows each settlement: callwarden settles a reservation with one UPDATE of
-- its usage_logs row ('reserved' to 'committed' or 'refunded') in the transaction that ends
-- the call, whoever ends it (a worker, the reconciler, a webhook, a cancel). Its trigger
-- gives the user's balance back what the order held and the call did not charge, exactly
-- once, or not at all if that transaction rolls back; callwarden's runtime role needs no
-- grant on accounts (applied after `callwarden migrate`; docs/embedding.md).
SELECT callwarden.follow_balance('accounts', 'balance', 'user_id');
