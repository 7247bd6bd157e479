-- The example's database: created by the examples test in a throw-away cluster (and by you with
-- `psql "$DATABASE_URL" -f schema.sql`).
CREATE TABLE users (
  id int4 PRIMARY KEY,
  name text NOT NULL,
  email text NOT NULL UNIQUE,
  created timestamptz NOT NULL
);
CREATE TABLE orders (
  id int4 PRIMARY KEY,
  user_id int4 NOT NULL REFERENCES users (id),
  total numeric(12, 2) NOT NULL CHECK (total >= 0),
  tags text[] NOT NULL DEFAULT '{}'
);
INSERT INTO users VALUES
  (1, 'Ada', 'ada@example.com', '2024-01-02T03:04:05Z'),
  (2, 'Linus', 'linus@example.com', '2024-06-30T12:00:00Z');
INSERT INTO orders VALUES
  (10, 1, 49.90, '{gift}'),
  (11, 1, 1234567890.01, '{}'),
  (12, 2, 0.00, '{free,promo}');
