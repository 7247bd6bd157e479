import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * GET /report/{id} for the lab's pool-overload scenario: the Kotlin article's blocking
 * architecture. Three sequential queries per request on the request thread (one of the 200), each
 * borrowing a connection from a pool of 4 (a fixed JDBC pool like HikariCP's with
 * connectionTimeout = 1 s: a borrower waits at most 1 s, then the request fails with 503). Nothing
 * bounds how many requests wait for a request thread or for a connection, and a query runs to its
 * end whatever the client's deadline — as in the article's thread-per-request service.
 *
 * The database comes from DB_JDBC_URL (jdbc:postgresql://HOST:PORT/DB?user=U); the PostgreSQL JDBC
 * driver must be on the class path (Debian: libpostgresql-jdbc-java, /usr/share/java/postgresql.jar).
 * DB_POOL (default 4) and DB_WAIT_MS (default 1000) size the pool.
 */
final class Report {
    /** The scenario's three statements (the same text as fanout's config, `?` for `$1`). */
    static final String[] QUERIES = {
        "SELECT count(*) AS n FROM t WHERE v % 97 = ?",
        "SELECT count(*) AS n FROM t WHERE v % 89 = ? % 89",
        "SELECT count(*) AS n FROM t WHERE v % 83 = ? % 83",
    };

    private static Pool pool;

    private Report() {}

    /** A fixed pool of connections; a borrower waits at most DB_WAIT_MS. */
    static final class Pool {
        final ArrayBlockingQueue<Connection> idle;
        final long waitMillis;

        Pool(String url, int size, long waitMillis) throws SQLException {
            this.idle = new ArrayBlockingQueue<>(size);
            this.waitMillis = waitMillis;
            for (int i = 0; i < size; i++) {
                idle.add(DriverManager.getConnection(url));
            }
        }

        Connection take() throws Failure {
            try {
                Connection c = idle.poll(waitMillis, TimeUnit.MILLISECONDS);
                if (c == null) {
                    throw new Failure(503, "pool_timeout",
                            "no database connection free within " + waitMillis + " ms");
                }
                return c;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new Failure(500, "internal", "interrupted");
            }
        }

        void give(Connection c) {
            idle.offer(c);
        }
    }

    private static synchronized Pool pool() throws Failure {
        if (pool == null) {
            String url = System.getenv("DB_JDBC_URL");
            if (url == null || url.isEmpty()) {
                throw new Failure(500, "internal", "DB_JDBC_URL is not set");
            }
            try {
                pool = new Pool(url, envInt("DB_POOL", 4), envInt("DB_WAIT_MS", 1000));
            } catch (SQLException e) {
                throw new Failure(503, "database_unavailable", "connecting: " + e.getMessage());
            }
        }
        return pool;
    }

    private static int envInt(String name, int dflt) {
        String v = System.getenv(name);
        try {
            return v == null || v.isEmpty() ? dflt : Integer.parseInt(v.trim());
        } catch (NumberFormatException e) {
            return dflt;
        }
    }

    /** One query on a borrowed connection: its single `n`. */
    private static long query(int i, long param) throws Failure {
        Pool p = pool();
        Connection c = p.take();
        try (PreparedStatement st = c.prepareStatement(QUERIES[i])) {
            st.setInt(1, (int) param);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        } catch (SQLException e) {
            throw new Failure(502, "database_error", e.getMessage());
        } finally {
            p.give(c);
        }
    }

    static Main.Answer run(String id) throws Failure {
        long n;
        try {
            n = Long.parseLong(id);
        } catch (NumberFormatException e) {
            throw new Failure(400, "bad_path", "the id is not a number");
        }
        long a = query(0, n % 97);
        long b = query(1, a);
        long c = query(2, b);
        return new Main.Answer("{\"a\":" + a + ",\"b\":" + b + ",\"c\":" + c + "}", null);
    }
}
