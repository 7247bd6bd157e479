import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * {@code GET /sequential} and {@code GET /parallel} — the lab's parallel-calls scenario, the
 * Kotlin article's experiment (seed 002): every request makes 100 calls to the items stub
 * ({@code GET /item/{i}}, ITEMS_ADDR, 1.5 ms each) and answers {"count": 100, "sum": 4950}, like
 * fanout's config.
 *
 * <p>Sequential: one blocking call after the other on the request thread. Parallel: the 100 calls
 * submitted to the calls pool at once, the request thread blocked until every one has answered.
 * The pool decides how parallel that is: with {@code --call-threads cpus} it has as many threads
 * as cores (the article's sync version, whose parallel calls scaled with the cores); with the
 * default it has 200 threads (java-threads); with {@code --virtual} every call is a virtual thread
 * of its own, and so is every request.
 */
final class ParallelCalls {
    /** Calls per request. */
    static final int CALLS = 100;

    private ParallelCalls() {}

    static Main.Answer sequential(Main app, long deadline) throws Failure {
        long sum = 0;
        for (int i = 0; i < CALLS; i++) {
            sum += id(app.items.get("/item/" + i, "items", deadline));
        }
        return answer(sum);
    }

    static Main.Answer parallel(Main app, long deadline) throws Failure {
        List<CompletableFuture<Object>> calls = new ArrayList<>(CALLS);
        for (int i = 0; i < CALLS; i++) {
            String path = "/item/" + i;
            calls.add(app.async(() -> app.items.get(path, "items", deadline)));
        }
        long sum = 0;
        for (CompletableFuture<Object> c : calls) {
            sum += id(Main.await(c, deadline));
        }
        return answer(sum);
    }

    private static Main.Answer answer(long sum) {
        return new Main.Answer("{\"count\":" + CALLS + ",\"sum\":" + sum + "}", null);
    }

    /** The item's numeric {@code id}. */
    private static long id(Object item) throws Failure {
        Object id = Json.get(item, "id");
        if (id instanceof Json.Num) {
            try {
                return Long.parseLong(((Json.Num) id).text);
            } catch (NumberFormatException e) {
                // below
            }
        }
        throw new Failure(502, "bad_backend_answer", "step `items`: backend `items` answered without an integer id");
    }
}
