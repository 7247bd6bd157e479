//! `GET /vacancies?text=…` — the `hh-vacancies` example by hand: search for ids, then fetch each
//! vacancy (at most 8 calls in flight, results in search order; no call when nothing was found),
//! and answer `{"total": <search total>, "items": [<vacancy>, …]}`.

use crate::error::Error;
use crate::{App, Body, interpolate, json_response};
use futures_util::{StreamExt, TryStreamExt, stream};
use http::Response;
use serde_json::{Map, Value};
use tokio::time::Instant;

/// Vacancy calls in flight at once (`concurrency: 8` in the example).
const CONCURRENCY: usize = 8;

pub(crate) async fn run(
    app: &App,
    query: Option<&str>,
    deadline: Instant,
) -> Result<Response<Body>, Error> {
    let mut found = app
        .search
        .get(&search_path(query), "found", deadline)
        .await?;
    // `when: $found.ids | length > 0`, `for_each: $found.ids`, `default: []`.
    let ids = match found.get_mut("ids").map(Value::take) {
        Some(Value::Array(ids)) => ids,
        _ => Vec::new(),
    };
    let items: Vec<Value> = stream::iter(ids)
        .map(|id| {
            let path = format!("/vacancies/{}", interpolate(&id));
            async move { app.vacancies.get(&path, "details", deadline).await }
        })
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
    let total = found.get_mut("total").map_or(Value::Null, Value::take);
    let mut body = Map::with_capacity(2);
    body.insert("total".into(), total);
    body.insert("items".into(), Value::Array(items));
    Ok(json_response(&Value::Object(body), None))
}

/// `/search` with the client's `text` parameter(s) re-encoded; no query when the client sent no
/// `text` (fanout leaves out null query values and repeats the name for a list).
fn search_path(query: Option<&str>) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k == "text" {
            out.append_pair("text", &v);
            any = true;
        }
    }
    if any {
        format!("/search?{}", out.finish())
    } else {
        "/search".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::search_path;

    #[test]
    fn search_path_reencodes_text() {
        assert_eq!(search_path(None), "/search");
        assert_eq!(search_path(Some("page=2")), "/search");
        assert_eq!(search_path(Some("text=rust")), "/search?text=rust");
        assert_eq!(
            search_path(Some("text=a%20b%2Cc&x=1")),
            "/search?text=a+b%2Cc"
        );
        assert_eq!(search_path(Some("text=a&text=b")), "/search?text=a&text=b");
        assert_eq!(search_path(Some("text=")), "/search?text=");
    }
}
