-- The pg-one-query scenario's database: 10 000 users with a primary key, so a lookup costs the
-- database almost nothing and the targets' own CPU per request is what differs.
CREATE TABLE users (id int4 PRIMARY KEY, name text NOT NULL, email text NOT NULL);
INSERT INTO users SELECT g, 'user ' || g, 'user' || g || '@example.com' FROM generate_series(1, 10000) g;
ANALYZE users;
