//! `POST /product-page` — the `product-page` example by hand.
//!
//! The client posts `{products, mask, recommendation_mask}`. Three calls start together: the
//! page's mask, the recommendation mask and the recommendations (optional: 50 ms, and on any
//! failure `[]` plus `"_partial": ["recs"]` / `x-fanout-partial: recs`). As soon as the page mask
//! is in, one batch call (`?ids=a,b`) per attribute service it lists runs for the products —
//! never waiting for the recommendations. Once the recommendations and their mask are in (and
//! only if there are recommendations), the same happens for the recommended ids. The answer
//! merges per id: `{id} + price[id] + stock[id] + media[id]`, a missing service adding nothing.

use crate::backend::Backend;
use crate::error::Error;
use crate::{App, Body, interpolate, join, json_response};
use futures_util::future::{try_join, try_join3};
use http::Response;
use serde_json::{Map, Value};
use tokio::time::Instant;

/// The step names of fanout's flow, reported in error bodies: main products, then recommended.
const MAIN_STEPS: [&str; 3] = ["price", "stock", "media"];
const RECOMMENDED_STEPS: [&str; 3] = ["rprice", "rstock", "rmedia"];

pub(crate) async fn run(
    app: &App,
    body: &[u8],
    deadline: Instant,
) -> Result<Response<Body>, Error> {
    let request: Value = serde_json::from_slice(body).map_err(|e| {
        Error::bad_body(
            "invalid_json",
            format!("request body is not valid JSON: {e}"),
        )
    })?;
    let Some(Value::Array(products)) = request.get("products") else {
        return Err(Error::bad_body(
            "invalid_body",
            "expected a JSON object with `products` (a list of ids), `mask` and `recommendation_mask`",
        ));
    };
    let field = |name| interpolate(request.get(name).unwrap_or(&Value::Null));
    let mask_path = format!("/masks/{}", field("mask"));
    let rmask_path = format!("/masks/{}", field("recommendation_mask"));
    let ids = join(products);
    let recs_path = format!("/recommendations/{ids}");

    let main = async {
        let mask = services(app.masks.get(&mask_path, "mask", deadline).await?);
        attributes(app, &mask, &ids, MAIN_STEPS, deadline).await
    };
    let recommended = async {
        let recs = async {
            // Optional: any failure (timeout included) falls back to no recommendations.
            let answer = app.recommendations.get(&recs_path, "recs", deadline).await;
            Ok(
                match answer.map(|mut a| a.get_mut("products").map(Value::take)) {
                    Ok(Some(Value::Array(recs))) => Some(recs),
                    _ => None,
                },
            )
        };
        let rmask = async {
            Ok(services(
                app.masks.get(&rmask_path, "rmask", deadline).await?,
            ))
        };
        let (recs, rmask) = try_join(recs, rmask).await?;
        let partial = recs.is_none();
        let recs = recs.unwrap_or_default();
        let attrs = if recs.is_empty() {
            Default::default()
        } else {
            attributes(app, &rmask, &join(&recs), RECOMMENDED_STEPS, deadline).await?
        };
        Ok::<_, Error>((recs, attrs, partial))
    };
    let (attrs, (recs, rattrs, partial)) = try_join(main, recommended).await?;

    let mut page = Map::with_capacity(3);
    page.insert("products".into(), merge(products, &attrs));
    page.insert("recommendations".into(), merge(&recs, &rattrs));
    if partial {
        page.insert("_partial".into(), Value::Array(vec!["recs".into()]));
    }
    Ok(json_response(
        &Value::Object(page),
        partial.then_some("recs"),
    ))
}

/// A mask answer's `.services` (a list of service names).
fn services(mut mask: Value) -> Value {
    mask.get_mut("services").map_or(Value::Null, Value::take)
}

/// Whether a mask asks for `service` (`$mask | index("price") != null`).
fn wants(mask: &Value, service: &str) -> bool {
    match mask {
        Value::Array(names) => names.iter().any(|n| n.as_str() == Some(service)),
        Value::String(s) => s.contains(service),
        _ => false,
    }
}

/// The price, stock and media answers for `ids` (joined), each `null` when the mask does not
/// list that service; the calls run concurrently.
async fn attributes(
    app: &App,
    mask: &Value,
    ids: &str,
    steps: [&'static str; 3],
    deadline: Instant,
) -> Result<[Value; 3], Error> {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("ids", ids)
        .finish();
    let [price, stock, media] = steps;
    let (p, s, m) = try_join3(
        attribute(&app.price, mask, &query, price, deadline),
        attribute(&app.stock, mask, &query, stock, deadline),
        attribute(&app.media, mask, &query, media, deadline),
    )
    .await?;
    Ok([p, s, m])
}

/// `GET /<service>?<query>` if the mask lists the service (backend name = service name = path).
async fn attribute(
    backend: &Backend,
    mask: &Value,
    query: &str,
    step: &'static str,
    deadline: Instant,
) -> Result<Value, Error> {
    if !wants(mask, backend.name) {
        return Ok(Value::Null);
    }
    let path = format!("/{}?{query}", backend.name);
    backend.get(&path, step, deadline).await
}

/// `[$ids[] as $id | {id: $id} + ($a[$id] // {}) + …]`: later services' fields follow earlier
/// ones; a repeated key keeps its first position and takes the later value, as jq's `+` does.
fn merge(ids: &[Value], attrs: &[Value; 3]) -> Value {
    ids.iter()
        .map(|id| {
            let mut item = Map::with_capacity(4);
            item.insert("id".into(), id.clone());
            if let Some(key) = id.as_str() {
                for answer in attrs {
                    if let Some(Value::Object(fields)) = answer.get(key) {
                        for (k, v) in fields {
                            item.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            Value::Object(item)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mask_membership() {
        let card = json!(["price", "stock", "media"]);
        assert!(wants(&card, "stock"));
        assert!(!wants(&json!(["price", "media"]), "stock"));
        assert!(!wants(&Value::Null, "price"));
        assert!(!wants(&json!([]), "price"));
    }

    #[test]
    fn merge_keeps_id_first_then_service_order() {
        let attrs = [
            json!({"p1": {"price": 61.5}}),
            Value::Null,
            json!({"p1": {"image": "i.jpg"}, "p2": 5}),
        ];
        let out = merge(&[json!("p1"), json!("p2"), json!("p1")], &attrs);
        assert_eq!(
            out.to_string(),
            r#"[{"id":"p1","price":61.5,"image":"i.jpg"},{"id":"p2"},{"id":"p1","price":61.5,"image":"i.jpg"}]"#
        );
    }

    #[test]
    fn merge_lets_later_fields_override_in_place() {
        let attrs = [
            json!({"a": {"id": "x", "n": 1}}),
            json!({"a": {"n": 2}}),
            Value::Null,
        ];
        assert_eq!(
            merge(&[json!("a")], &attrs).to_string(),
            r#"[{"id":"x","n":2}]"#
        );
    }
}
