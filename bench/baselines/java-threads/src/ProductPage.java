import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;

/**
 * {@code POST /product-page} — the product-page example. Three calls start together on the
 * calls pool: the page's mask, the recommendation mask and the recommendations (optional: on any
 * failure, 50 ms timeout included, [] plus "_partial": ["recs"] and x-fanout-partial: recs). As
 * soon as the page mask is in, one batch call per attribute service it lists runs for the
 * products — never waiting for the recommendations; once the recommendations and their mask are
 * in (and there are recommendations), the same for the recommended ids. The request thread waits
 * for both branches and merges per id: {id} + price[id] + stock[id] + media[id].
 */
final class ProductPage {
    private ProductPage() {}

    private static final String[] MAIN_STEPS = {"price", "stock", "media"};
    private static final String[] RECOMMENDED_STEPS = {"rprice", "rstock", "rmedia"};

    static Main.Answer run(Main app, byte[] body, long deadline) throws Failure {
        Object request;
        try {
            request = Json.parse(body);
        } catch (Json.ParseError e) {
            throw new Failure(400, "invalid_json", "request body is not valid JSON: " + e.getMessage());
        }
        Object productsValue = Json.get(request, "products");
        if (!(productsValue instanceof List)) {
            throw new Failure(400, "invalid_body",
                    "expected a JSON object with `products` (a list of ids), `mask` and `recommendation_mask`");
        }
        List<?> products = (List<?>) productsValue;
        String maskPath = "/masks/" + field(request, "mask");
        String rmaskPath = "/masks/" + field(request, "recommendation_mask");
        String ids = Json.join(products);
        String recsPath = "/recommendations/" + ids;

        CompletableFuture<Object> mask = app.async(() -> services(app.masks.get(maskPath, "mask", deadline)));
        CompletableFuture<Object[]> main = mask.thenCompose(m -> attributes(app, m, ids, MAIN_STEPS, deadline));
        // Optional: any failure falls back to no recommendations (null = partial).
        CompletableFuture<List<?>> recs = app.async(() -> app.recommendations.get(recsPath, "recs", deadline))
                .handle((answer, error) -> {
                    Object p = error == null ? Json.get(answer, "products") : null;
                    return p instanceof List ? (List<?>) p : null;
                });
        CompletableFuture<Object> rmask = app.async(() -> services(app.masks.get(rmaskPath, "rmask", deadline)));
        CompletableFuture<Object[]> recommended = recs.thenCombine(rmask, (r, m) -> new Object[] {r, m})
                .thenCompose(rm -> {
                    List<?> r = (List<?>) rm[0];
                    if (r == null || r.isEmpty()) {
                        return CompletableFuture.completedFuture(new Object[] {null, null, null});
                    }
                    return attributes(app, rm[1], Json.join(r), RECOMMENDED_STEPS, deadline);
                });

        Object[] attrs = Main.await(main, deadline);
        Object[] rattrs = Main.await(recommended, deadline);
        List<?> recList = Main.await(recs, deadline);
        boolean partial = recList == null;

        Map<String, Object> page = new LinkedHashMap<>();
        page.put("products", merge(products, attrs));
        page.put("recommendations", merge(partial ? List.of() : recList, rattrs));
        if (partial) {
            page.put("_partial", List.of("recs"));
        }
        return new Main.Answer(Json.write(page), partial ? "recs" : null);
    }

    private static String field(Object request, String name) {
        Object v = Json.get(request, name);
        return Json.interpolate(v == null ? Json.NULL : v);
    }

    /** A mask answer's .services (a list of service names). */
    private static Object services(Object mask) {
        Object s = Json.get(mask, "services");
        return s == null ? Json.NULL : s;
    }

    /** Whether a mask asks for the service ($mask | index("price") != null). */
    static boolean wants(Object mask, String service) {
        if (mask instanceof List) {
            for (Object n : (List<?>) mask) {
                if (service.equals(n)) {
                    return true;
                }
            }
            return false;
        }
        return mask instanceof String && ((String) mask).contains(service);
    }

    /** The price, stock and media answers for ids, each null when the mask does not list it. */
    private static CompletableFuture<Object[]> attributes(Main app, Object mask, String ids, String[] steps,
            long deadline) {
        String query = "ids=" + URLEncoder.encode(ids, StandardCharsets.UTF_8);
        Backend[] backends = {app.price, app.stock, app.media};
        List<CompletableFuture<Object>> calls = new ArrayList<>(3);
        for (int k = 0; k < 3; k++) {
            Backend b = backends[k];
            String step = steps[k];
            if (wants(mask, b.name)) {
                String path = "/" + b.name + "?" + query;
                calls.add(app.async(() -> b.get(path, step, deadline)));
            } else {
                calls.add(CompletableFuture.completedFuture(Json.NULL));
            }
        }
        return CompletableFuture.allOf(calls.toArray(new CompletableFuture<?>[0]))
                .thenApply(v -> new Object[] {calls.get(0).join(), calls.get(1).join(), calls.get(2).join()});
    }

    /** [ids[] as $id | {id: $id} + (a[$id] // {}) + …], later fields overriding in place. */
    private static List<Object> merge(List<?> ids, Object[] attrs) {
        List<Object> out = new ArrayList<>(ids.size());
        for (Object id : ids) {
            Map<String, Object> item = new LinkedHashMap<>();
            item.put("id", id);
            if (id instanceof String) {
                for (Object answer : attrs) {
                    Object fields = Json.get(answer, (String) id);
                    if (fields instanceof Map) {
                        for (Map.Entry<?, ?> e : ((Map<?, ?>) fields).entrySet()) {
                            item.put(String.valueOf(e.getKey()), e.getValue());
                        }
                    }
                }
            }
            out.add(item);
        }
        return out;
    }
}
