import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.http.HttpClient;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

/**
 * java-threads: the load lab's thread-per-request baseline. The two example flows
 * (hh-vacancies and product-page) the way the seeds' Java services were written: the JDK's
 * {@code com.sun.net.httpserver.HttpServer} on a fixed pool of 200 request threads, each request
 * running on one thread that blocks on every backend call ({@code HttpClient.send}); calls that
 * the flow makes in parallel run on a second fixed pool of 200 threads ("calls"), and the
 * request thread waits for them. No framework, no libraries.
 *
 * <pre>java -Xss256k -XX:+UseSerialGC -Xmx512m -cp CLASSES Main [--listen ADDR] [--threads N] [--call-threads N|cpus] [--virtual]</pre>
 *
 * Backends (host:port) come from SEARCH_ADDR, VACANCIES_ADDR, MASKS_ADDR, RECOMMENDATIONS_ADDR,
 * PRICE_ADDR, STOCK_ADDR, MEDIA_ADDR with the examples' defaults — as for hyper-aggregator.
 * GET /report/{id} (the pool-overload scenario) is {@link Report}: blocking JDBC on a pool of 4.
 * GET /sequential and GET /parallel (the parallel-calls scenario) are {@link ParallelCalls}: 100
 * blocking calls to ITEMS_ADDR per request. {@code --call-threads cpus} sizes the calls pool by
 * the CPU count (the lab's java-blocking); {@code --virtual} runs requests and calls on virtual
 * threads instead of the two pools (java-virtual; Java 21+).
 */
public final class Main {
    static final String DEADLINE_HEADER = "x-request-timeout";
    static final String PARTIAL_HEADER = "x-fanout-partial";
    static final int MAX_BODY_BYTES = 1 << 20;

    static final String[][] VARS = {
        {"SEARCH_ADDR", "127.0.0.1:9101"},
        {"VACANCIES_ADDR", "127.0.0.1:9102"},
        {"MASKS_ADDR", "127.0.0.1:9201"},
        {"RECOMMENDATIONS_ADDR", "127.0.0.1:9202"},
        {"PRICE_ADDR", "127.0.0.1:9203"},
        {"STOCK_ADDR", "127.0.0.1:9204"},
        {"MEDIA_ADDR", "127.0.0.1:9205"},
        {"ITEMS_ADDR", "127.0.0.1:9501"},
    };

    private static final String USAGE = String.join("\n",
            "usage: java -cp CLASSES Main [--listen ADDR] [--threads N] [--call-threads N|cpus] [--virtual] [--prestart]",
            "",
            "Serves GET /vacancies and POST /product-page (the hh-vacancies and product-page examples),",
            "GET /report/{id} (pool-overload), GET /sequential and GET /parallel (parallel-calls)",
            "thread-per-request with blocking backend calls, as the load lab's Java baseline.",
            "",
            "  --listen ADDR            listen address (default: $LISTEN, else 127.0.0.1:8090)",
            "  --threads N              request threads (default 200)",
            "  --call-threads N|cpus    threads for parallel backend calls (default 200; cpus: as many",
            "                           as the JVM sees processors)",
            "  --virtual                a virtual thread per request and per parallel call instead of",
            "                           the two pools (Java 21+)",
            "  --prestart               start every pool thread at once (the steady state of a server",
            "                           that has served its first N requests)",
            "",
            "Backends (host:port): SEARCH_ADDR VACANCIES_ADDR MASKS_ADDR RECOMMENDATIONS_ADDR",
            "PRICE_ADDR STOCK_ADDR MEDIA_ADDR ITEMS_ADDR, defaults as in the examples.");

    final Backend search;
    final Backend vacancies;
    final Backend masks;
    final Backend recommendations;
    final Backend price;
    final Backend stock;
    final Backend media;
    final Backend items;
    private final ExecutorService calls;

    Main(HttpClient client, ExecutorService calls) {
        this.calls = calls;
        search = new Backend("search", addr(0), 150, client);
        vacancies = new Backend("vacancies", addr(1), 100, client);
        masks = new Backend("masks", addr(2), 100, client);
        recommendations = new Backend("recommendations", addr(3), 50, client);
        price = new Backend("price", addr(4), 100, client);
        stock = new Backend("stock", addr(5), 100, client);
        media = new Backend("media", addr(6), 100, client);
        // 2 s, as fanout's parallel-calls config: a loaded machine slows calls, it should not fail them.
        items = new Backend("items", addr(7), 2000, client);
    }

    private static String addr(int i) {
        String v = System.getenv(VARS[i][0]);
        return v == null || v.isEmpty() ? VARS[i][1] : v;
    }

    /** A blocking backend call, run on the calls pool. */
    interface Call {
        Object run() throws Failure;
    }

    CompletableFuture<Object> async(Call c) {
        Supplier<Object> s = () -> {
            try {
                return c.run();
            } catch (Failure f) {
                throw new CompletionException(f);
            }
        };
        return CompletableFuture.supplyAsync(s, calls);
    }

    /** Wait for {@code f} until the request deadline; failures surface as {@link Failure}. */
    static <T> T await(CompletableFuture<T> f, long deadlineNanos) throws Failure {
        try {
            return f.get(Math.max(0, deadlineNanos - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            f.cancel(false);
            throw new Failure(504, "deadline_exceeded", "route deadline exceeded while waiting for the flow");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Failure(500, "internal", "interrupted");
        } catch (CancellationException e) {
            throw new Failure(500, "internal", "cancelled");
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            while (c instanceof CompletionException && c.getCause() != null) {
                c = c.getCause();
            }
            if (c instanceof Failure) {
                throw (Failure) c;
            }
            throw new Failure(500, "internal", String.valueOf(c));
        }
    }

    private void handle(HttpExchange ex) {
        long start = System.nanoTime();
        try {
            String path = ex.getRequestURI().getRawPath();
            String method = ex.getRequestMethod();
            Answer answer;
            if (path.equals("/vacancies")) {
                if (!method.equals("GET")) {
                    throw notAllowed(method, path, "GET");
                }
                long deadline = deadline(ex, start, 500);
                drain(ex, deadline);
                answer = Vacancies.run(this, ex.getRequestURI().getRawQuery(), deadline);
            } else if (path.equals("/product-page")) {
                if (!method.equals("POST")) {
                    throw notAllowed(method, path, "POST");
                }
                long deadline = deadline(ex, start, 300);
                byte[] body = readBody(ex, deadline);
                answer = ProductPage.run(this, body, deadline);
            } else if (path.startsWith("/report/")) {
                if (!method.equals("GET")) {
                    throw notAllowed(method, path, "GET");
                }
                drain(ex, deadline(ex, start, 1000));
                answer = Report.run(path.substring("/report/".length()));
            } else if (path.equals("/sequential") || path.equals("/parallel")) {
                if (!method.equals("GET")) {
                    throw notAllowed(method, path, "GET");
                }
                long deadline = deadline(ex, start, 10_000);
                drain(ex, deadline);
                answer = path.equals("/sequential")
                        ? ParallelCalls.sequential(this, deadline)
                        : ParallelCalls.parallel(this, deadline);
            } else {
                throw new Failure(404, "not_found", "no route for " + path);
            }
            respond(ex, 200, answer.body, answer.partial, null);
        } catch (Failure f) {
            respond(ex, f.status, f.body(), null, f.allow);
        } catch (RuntimeException e) {
            respond(ex, 500, new Failure(500, "internal", String.valueOf(e)).body(), null, null);
        } finally {
            ex.close();
        }
    }

    /** A 200 answer: the JSON text and the optional step that fell back, if any. */
    static final class Answer {
        final String body;
        final String partial;

        Answer(String body, String partial) {
            this.body = body;
            this.partial = partial;
        }
    }

    private static Failure notAllowed(String method, String path, String allow) {
        return new Failure(405, "method_not_allowed",
                method + " is not allowed on " + path + "; allowed: " + allow, null, null, allow);
    }

    /** The route's deadline, shortened by the client's x-request-timeout if it sends one. */
    private static long deadline(HttpExchange ex, long start, long routeMillis) throws Failure {
        long budget = routeMillis;
        String h = ex.getRequestHeaders().getFirst(DEADLINE_HEADER);
        if (h != null) {
            long ms;
            try {
                ms = Long.parseLong(h.trim());
                if (ms < 0) {
                    throw new NumberFormatException();
                }
            } catch (NumberFormatException e) {
                throw new Failure(400, "bad_header",
                        "header " + DEADLINE_HEADER + ": expected a number of milliseconds");
            }
            budget = Math.min(budget, ms);
        }
        return start + budget * 1_000_000L;
    }

    private static void drain(HttpExchange ex, long deadline) throws Failure {
        readBody(ex, deadline);
    }

    /** The request body, at most 1 MiB. */
    private static byte[] readBody(HttpExchange ex, long deadline) throws Failure {
        Failure tooLarge = new Failure(413, "body_too_large", "request body exceeds " + MAX_BODY_BYTES + " bytes");
        String cl = ex.getRequestHeaders().getFirst("Content-Length");
        if (cl != null) {
            try {
                if (Long.parseLong(cl.trim()) > MAX_BODY_BYTES) {
                    throw tooLarge;
                }
            } catch (NumberFormatException e) {
                // The server already rejected malformed lengths; read what comes.
            }
        }
        try (InputStream in = ex.getRequestBody()) {
            byte[] b = in.readNBytes(MAX_BODY_BYTES + 1);
            if (b.length > MAX_BODY_BYTES) {
                throw tooLarge;
            }
            return b;
        } catch (IOException e) {
            throw new Failure(400, "bad_body", "reading the request body failed: " + e.getMessage());
        }
    }

    private static void respond(HttpExchange ex, int status, String body, String partial, String allow) {
        try {
            byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
            ex.getResponseHeaders().set("Content-Type", "application/json");
            if (partial != null) {
                ex.getResponseHeaders().set(PARTIAL_HEADER, partial);
            }
            if (allow != null) {
                ex.getResponseHeaders().set("Allow", allow);
            }
            ex.sendResponseHeaders(status, bytes.length == 0 ? -1 : bytes.length);
            try (OutputStream out = ex.getResponseBody()) {
                out.write(bytes);
            }
        } catch (IOException e) {
            // The client went away; nothing to tell it.
        }
    }

    private static ThreadFactory named(String prefix) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, prefix + "-" + n.incrementAndGet());
            t.setDaemon(false);
            return t;
        };
    }

    private static InetSocketAddress parseListen(String s) {
        int colon = s.lastIndexOf(':');
        if (colon < 0) {
            throw new IllegalArgumentException("expected HOST:PORT, got `" + s + "`");
        }
        String host = s.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        int port;
        try {
            port = Integer.parseInt(s.substring(colon + 1));
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("bad port in `" + s + "`");
        }
        return new InetSocketAddress(host, port);
    }

    /**
     * {@code Executors.newVirtualThreadPerTaskExecutor()} (Java 21+): one new virtual thread per
     * task. Looked up at run time, so the baseline still compiles with (and runs the other
     * targets on) JDK 17; on an older runtime {@code --virtual} stops with this message.
     */
    static ExecutorService virtualThreads() {
        try {
            return (ExecutorService) Executors.class.getMethod("newVirtualThreadPerTaskExecutor").invoke(null);
        } catch (ReflectiveOperationException e) {
            throw new IllegalArgumentException("--virtual needs Java 21 or later (virtual threads); this is Java "
                    + Runtime.version());
        }
    }

    private static int positive(String name, String v) {
        try {
            int n = Integer.parseInt(v);
            if (n > 0) {
                return n;
            }
        } catch (NumberFormatException e) {
            // below
        }
        throw new IllegalArgumentException(name + ": expected a positive number, got `" + v + "`");
    }

    public static void main(String[] args) {
        // TCP_NODELAY on accepted sockets, as every production servlet container sets it: the JDK
        // server writes headers and body separately, and Nagle + delayed ACK would add ~40 ms
        // to every keep-alive answer. Must be set before the server classes load.
        System.setProperty("sun.net.httpserver.nodelay", "true");
        String listen = System.getenv("LISTEN");
        if (listen == null || listen.isEmpty()) {
            listen = "127.0.0.1:8090";
        }
        int threads = 200;
        int callThreads = 200;
        boolean virtual = false;
        boolean prestart = false;
        InetSocketAddress addr;
        try {
            for (int i = 0; i < args.length; i++) {
                String a = args[i];
                String value = null;
                int eq = a.indexOf('=');
                if (a.startsWith("--") && eq > 0) {
                    value = a.substring(eq + 1);
                    a = a.substring(0, eq);
                }
                if (a.equals("-h") || a.equals("--help")) {
                    System.out.println(USAGE);
                    return;
                }
                if (a.equals("--virtual") && value == null) {
                    virtual = true;
                    continue;
                }
                if (a.equals("--prestart") && value == null) {
                    prestart = true;
                    continue;
                }
                if (!a.equals("--listen") && !a.equals("--threads") && !a.equals("--call-threads")) {
                    throw new IllegalArgumentException("unknown argument `" + a + "`");
                }
                if (value == null) {
                    if (i + 1 >= args.length) {
                        throw new IllegalArgumentException(a + " needs a value");
                    }
                    value = args[++i];
                }
                switch (a) {
                    case "--listen":
                        listen = value;
                        break;
                    case "--threads":
                        threads = positive(a, value);
                        break;
                    default:
                        callThreads = value.equals("cpus")
                                ? Runtime.getRuntime().availableProcessors()
                                : positive(a, value);
                }
            }
            addr = parseListen(listen);
        } catch (IllegalArgumentException e) {
            System.err.println("error: " + e.getMessage() + "\n\n" + USAGE);
            System.exit(2);
            return;
        }
        HttpClient client = HttpClient.newBuilder()
                .version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofMillis(500))
                .build();
        ExecutorService callPool;
        ExecutorService requestPool;
        try {
            callPool = virtual ? virtualThreads() : Executors.newFixedThreadPool(callThreads, named("calls"));
            requestPool = virtual ? virtualThreads() : Executors.newFixedThreadPool(threads, named("request"));
            // Every pool thread started now, as they all are after a long-running server's first
            // N requests (a fixed pool never retires its threads): the lab's pool comparison
            // measures that steady state, not thread creation.
            if (prestart && !virtual) {
                ((ThreadPoolExecutor) callPool).prestartAllCoreThreads();
                ((ThreadPoolExecutor) requestPool).prestartAllCoreThreads();
            }
        } catch (IllegalArgumentException e) {
            System.err.println("error: " + e.getMessage());
            System.exit(2);
            return;
        }
        Main app = new Main(client, callPool);
        HttpServer server;
        try {
            // Backlog 1024: like a servlet container's accept queue, so bursts of new
            // connections are not refused by a tiny default backlog.
            server = HttpServer.create(addr, 1024);
        } catch (IOException e) {
            System.err.println("error: binding " + listen + ": " + e.getMessage());
            System.exit(1);
            return;
        }
        server.createContext("/", app::handle);
        server.setExecutor(requestPool);
        server.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> server.stop(1)));
        System.err.println("java-threads listening on " + server.getAddress() + " (Java " + Runtime.version()
                + ", " + (virtual
                        ? "virtual threads for requests and calls"
                        : threads + " request threads, " + callThreads + " call threads") + ")");
    }
}
