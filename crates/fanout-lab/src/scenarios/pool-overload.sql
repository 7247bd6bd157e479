-- The pool-overload scenario's database: one table without indexes, so each of a request's three
-- statements scans it (~25 ms of CPU each here), and the database's capacity is set by the pool
-- of 4 and that cost, as in the Kotlin article (~30 ms queries). One core per statement.
ALTER DATABASE postgres SET max_parallel_workers_per_gather = 0;
CREATE TABLE t AS
  SELECT g AS id, ((g::int8 * 7919) % 100000)::int4 AS v, md5(g::text) AS pad
  FROM generate_series(1, 600000) g;
ANALYZE t;
