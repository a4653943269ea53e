-- The host's own table: each user's credit balance (an order holds a render's price on it).
CREATE TABLE IF NOT EXISTS accounts (
    user_id text PRIMARY KEY,
    balance numeric NOT NULL CHECK (balance >= 0)
);
