//! `GET /posts?page=N` — the lab's `n-plus-one` scenario by hand (Tailcall's N+1 benchmark): the
//! page's 100 posts, then each distinct author once (all in parallel), joined into
//! `[{"id", "title", "user": {"id", "name", "email"}}, …]` in the posts' order.
//!
//! fanout's route (`crates/fanout-lab/src/scenarios/n-plus-one.yaml`) calls users once per post
//! with all 100 calls started at once, and its in-flight dedup merges them into one call per
//! distinct user: 1 + 10 calls per request, which is what this handler makes directly.

use crate::error::Error;
use crate::{App, Body, interpolate, json_response};
use futures_util::future::try_join_all;
use http::{Response, StatusCode};
use serde_json::{Map, Value};
use std::collections::HashMap;
use tokio::time::Instant;

pub(crate) async fn run(
    app: &App,
    query: Option<&str>,
    deadline: Instant,
) -> Result<Response<Body>, Error> {
    let posts = app.posts.get(&posts_path(query), "posts", deadline).await?;
    let Value::Array(posts) = posts else {
        return Err(Error::new(
            StatusCode::BAD_GATEWAY,
            "bad_backend_answer",
            "step `users`: `for_each` needs a list, backend `posts` answered something else",
        ));
    };
    // One call per distinct author, in order of first appearance, all in flight at once.
    let mut ids: Vec<String> = Vec::new();
    for p in &posts {
        let id = interpolate(&p["userId"]).into_owned();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let users = try_join_all(ids.iter().map(|id| {
        let path = format!("/users/{id}");
        async move { app.users.get(&path, "users", deadline).await }
    }))
    .await?;
    // `result: '{id, name, email}'` per user.
    let by_id: HashMap<&str, Value> = ids
        .iter()
        .zip(users)
        .map(|(id, mut u)| {
            let mut user = Map::with_capacity(3);
            for k in ["id", "name", "email"] {
                user.insert(k.into(), u.get_mut(k).map_or(Value::Null, Value::take));
            }
            (id.as_str(), Value::Object(user))
        })
        .collect();
    let out: Vec<Value> = posts
        .into_iter()
        .map(|mut p| {
            let user = by_id
                .get(interpolate(&p["userId"]).as_ref())
                .cloned()
                .unwrap_or(Value::Null);
            let mut o = Map::with_capacity(3);
            o.insert(
                "id".into(),
                p.get_mut("id").map_or(Value::Null, Value::take),
            );
            o.insert(
                "title".into(),
                p.get_mut("title").map_or(Value::Null, Value::take),
            );
            o.insert("user".into(), user);
            Value::Object(o)
        })
        .collect();
    Ok(json_response(&Value::Array(out), None))
}

/// `/posts` with the client's `page` parameter(s) re-encoded; no query without one (fanout leaves
/// out null query values).
fn posts_path(query: Option<&str>) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k == "page" {
            out.append_pair("page", &v);
            any = true;
        }
    }
    if any {
        format!("/posts?{}", out.finish())
    } else {
        "/posts".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::posts_path;

    #[test]
    fn posts_path_reencodes_page() {
        assert_eq!(posts_path(None), "/posts");
        assert_eq!(posts_path(Some("x=1")), "/posts");
        assert_eq!(posts_path(Some("page=7&x=1")), "/posts?page=7");
    }
}
