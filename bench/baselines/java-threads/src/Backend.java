import java.io.IOException;
import java.net.ConnectException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * One backend, called with the JDK's HttpClient in blocking mode ({@code send}): the calling
 * thread waits for the answer. A call waits min(backend timeout, time left before the request
 * deadline), tells the backend that budget in {@code x-request-timeout}, and returns the answer
 * parsed as JSON — like fanout and the hyper baseline.
 */
final class Backend {
    /** Largest accepted backend answer (fanout's default max_response_bytes). */
    private static final int MAX_RESPONSE_BYTES = 16 << 20;

    final String name;
    private final String origin;
    private final long timeoutNanos;
    private final HttpClient client;

    Backend(String name, String addr, long timeoutMillis, HttpClient client) {
        this.name = name;
        this.origin = "http://" + addr;
        this.timeoutNanos = timeoutMillis * 1_000_000L;
        this.client = client;
    }

    /** GET {@code pathAndQuery} for flow step {@code step}; an empty answer is JSON null. */
    Object get(String pathAndQuery, String step, long deadlineNanos) throws Failure {
        long left = deadlineNanos - System.nanoTime();
        long timeout = Math.min(timeoutNanos, left);
        if (timeout <= 0) {
            throw timedOut(step, Math.max(timeout, 0));
        }
        long budgetMs = Math.max(1, timeout / 1_000_000L);
        String uri = origin + pathAndQuery;
        HttpRequest request;
        try {
            request = HttpRequest.newBuilder(URI.create(uri))
                    .timeout(Duration.ofNanos(timeout))
                    .header(Main.DEADLINE_HEADER, Long.toString(budgetMs))
                    .GET()
                    .build();
        } catch (IllegalArgumentException e) {
            throw error(502, "backend_unavailable", step, "invalid request to `" + uri + "`: " + e.getMessage());
        }
        HttpResponse<byte[]> resp;
        try {
            resp = client.send(request, HttpResponse.BodyHandlers.ofByteArray());
        } catch (HttpConnectTimeoutException e) {
            throw error(502, "backend_unavailable", step, "connect timed out: " + e.getMessage());
        } catch (HttpTimeoutException e) {
            throw timedOut(step, timeout);
        } catch (ConnectException e) {
            throw error(502, "backend_unavailable", step, "connect failed: " + e);
        } catch (IOException e) {
            throw error(502, "backend_reset", step, "request failed: " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw error(502, "backend_reset", step, "interrupted");
        }
        byte[] body = resp.body() == null ? new byte[0] : resp.body();
        int status = resp.statusCode();
        if (status < 200 || status > 299) {
            String snippet = new String(body, 0, Math.min(body.length, 200), StandardCharsets.UTF_8);
            throw error(502, "backend_status", step,
                    "answered " + status + (snippet.isEmpty() ? "" : ": " + snippet));
        }
        if (body.length > MAX_RESPONSE_BYTES) {
            throw error(502, "bad_backend_answer", step, "answer larger than " + MAX_RESPONSE_BYTES + " bytes");
        }
        if (body.length == 0) {
            return Json.NULL;
        }
        try {
            return Json.parse(body);
        } catch (Json.ParseError e) {
            throw error(502, "bad_backend_answer", step, "answered invalid JSON: " + e.getMessage());
        }
    }

    /** 504: the call's own timeout, or deadline_exceeded when the request deadline cut it short. */
    private Failure timedOut(String step, long waitedNanos) {
        String waited = String.format("%.1f ms", waitedNanos / 1e6);
        if (waitedNanos < timeoutNanos) {
            return Failure.call(504, "deadline_exceeded", step, name,
                    "step `" + step + "`: the request deadline passed after waiting " + waited
                            + " for backend `" + name + "`");
        }
        return Failure.call(504, "backend_timeout", step, name,
                "step `" + step + "`: backend `" + name + "` did not answer within its timeout (" + waited + ")");
    }

    private Failure error(int status, String code, String step, String what) {
        return Failure.call(status, code, step, name, "step `" + step + "`: backend `" + name + "`: " + what);
    }
}
