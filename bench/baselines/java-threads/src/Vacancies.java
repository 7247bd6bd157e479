import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;

/**
 * {@code GET /vacancies?text=…} — the hh-vacancies example: search for ids (on the request
 * thread), then each vacancy on the calls pool, at most 8 in flight, results in search order; no
 * call when nothing was found. Answers {"total": search total, "items": [vacancy, …]}.
 */
final class Vacancies {
    private Vacancies() {}

    /** Vacancy calls in flight at once (concurrency: 8 in the example). */
    private static final int CONCURRENCY = 8;

    static Main.Answer run(Main app, String rawQuery, long deadline) throws Failure {
        Object found = app.search.get(searchPath(rawQuery), "found", deadline);
        Object ids = Json.get(found, "ids");
        List<Object> items = new ArrayList<>();
        if (ids instanceof List) {
            List<?> list = (List<?>) ids;
            List<CompletableFuture<Object>> calls = new ArrayList<>(list.size());
            for (int i = 0; i < list.size(); i++) {
                if (i >= CONCURRENCY) {
                    Main.await(calls.get(i - CONCURRENCY), deadline);
                }
                String path = "/vacancies/" + Json.interpolate(list.get(i));
                calls.add(app.async(() -> app.vacancies.get(path, "details", deadline)));
            }
            for (CompletableFuture<Object> c : calls) {
                items.add(Main.await(c, deadline));
            }
        }
        Object total = Json.get(found, "total");
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("total", total == null ? Json.NULL : total);
        body.put("items", items);
        return new Main.Answer(Json.write(body), null);
    }

    /** /search with the client's text parameter(s) re-encoded; no query without text. */
    static String searchPath(String rawQuery) {
        StringBuilder q = new StringBuilder();
        if (rawQuery != null && !rawQuery.isEmpty()) {
            for (String pair : rawQuery.split("&")) {
                if (pair.isEmpty()) {
                    continue;
                }
                int eq = pair.indexOf('=');
                String k = decode(eq < 0 ? pair : pair.substring(0, eq));
                String v = eq < 0 ? "" : decode(pair.substring(eq + 1));
                if (k.equals("text")) {
                    if (q.length() > 0) {
                        q.append('&');
                    }
                    q.append("text=").append(URLEncoder.encode(v, StandardCharsets.UTF_8));
                }
            }
        }
        return q.length() == 0 ? "/search" : "/search?" + q;
    }

    private static String decode(String s) {
        try {
            return URLDecoder.decode(s, StandardCharsets.UTF_8);
        } catch (IllegalArgumentException e) {
            return s;
        }
    }
}
