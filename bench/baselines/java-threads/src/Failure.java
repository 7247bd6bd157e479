import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A failed request: the same status codes, {@code code} strings and body shape as fanout
 * ({@code {"error": {"code", "message", "step", "backend"}}}).
 */
final class Failure extends Exception {
    final int status;
    final String code;
    final String step;
    final String backend;
    /** {@code Allow} header for 405, else null. */
    final String allow;

    Failure(int status, String code, String message) {
        this(status, code, message, null, null, null);
    }

    Failure(int status, String code, String message, String step, String backend, String allow) {
        super(message, null, false, false);
        this.status = status;
        this.code = code;
        this.step = step;
        this.backend = backend;
        this.allow = allow;
    }

    /** A failed backend call of flow step {@code step}. */
    static Failure call(int status, String code, String step, String backend, String message) {
        return new Failure(status, code, message, step, backend, null);
    }

    String body() {
        Map<String, Object> e = new LinkedHashMap<>();
        e.put("code", code);
        e.put("message", getMessage());
        e.put("step", step == null ? Json.NULL : step);
        e.put("backend", backend == null ? Json.NULL : backend);
        Map<String, Object> top = new LinkedHashMap<>();
        top.put("error", e);
        return Json.write(top);
    }
}
