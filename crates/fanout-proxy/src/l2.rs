//! The shared Redis behind the answer caches (`redis:` in the config, `cache: {l2: true}` per
//! backend): the [`L2Store`] over the `redis` crate's `ConnectionManager` (one multiplexed
//! connection, reconnected in the background when it breaks). What is stored, the time limits,
//! the breaker and the counters are `fanout_layers::l2`'s; this module only speaks Redis.
//!
//! Nothing connects before the first command (building a gateway does no I/O, and a Redis that
//! is down at start only means caches in memory). Each connection attempt is limited by
//! `connect_timeout` and made once: retrying is the breaker's job, so a failed attempt is
//! reported at once instead of holding commands.

use bytes::Bytes;
use fanout_config::{ConfigError, RedisConfig};
use fanout_layers::l2::{L2, L2Error, L2Policy, L2Store};
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Redis as an [`L2Store`].
pub struct RedisStore(Arc<Conn>);

struct Conn {
    client: redis::Client,
    config: ConnectionManagerConfig,
    manager: OnceCell<ConnectionManager>,
}

impl RedisStore {
    /// A store for `cfg` (checks the URL; no I/O).
    pub fn new(cfg: &RedisConfig) -> Result<RedisStore, ConfigError> {
        let client = redis::Client::open(cfg.url.value.as_str()).map_err(|e| {
            // The URL may hold a password: the message names the problem, not the URL.
            ConfigError::at(
                cfg.url.pos,
                format!("redis.url is not a valid Redis URL ({})", e.category()),
            )
            .hint("e.g. `redis://redis.default.svc:6379/?protocol=resp3`")
        })?;
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_connection_timeout(Some(cfg.connect_timeout.0))
            .set_response_timeout(Some(cfg.timeout.0));
        Ok(RedisStore(Arc::new(Conn {
            client,
            config,
            manager: OnceCell::new(),
        })))
    }
}

impl Conn {
    /// The connection manager, created on first use (it must be created inside the runtime).
    async fn get(&self) -> Result<ConnectionManager, L2Error> {
        self.manager
            .get_or_try_init(|| async {
                ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
            })
            .await
            .cloned()
            .map_err(failed)
    }
}

fn failed(e: redis::RedisError) -> L2Error {
    if e.code() == Some("WRONGTYPE") {
        L2Error::WrongType
    } else {
        L2Error::Failed(e.to_string())
    }
}

impl L2Store for RedisStore {
    fn get(&self, key: String, limit: usize) -> BoxFuture<'static, Result<Bytes, L2Error>> {
        // GETRANGE reads at most `limit` bytes whatever the value's size ("" when absent).
        let mut cmd = redis::cmd("GETRANGE");
        cmd.arg(&key).arg(0).arg(limit.saturating_sub(1));
        let conn = self.0.clone();
        Box::pin(async move { conn.query::<Vec<u8>>(&cmd).await.map(Bytes::from) })
    }

    fn set(
        &self,
        key: String,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<(), L2Error>> {
        let px = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(value.as_ref()).arg("PX").arg(px);
        let conn = self.0.clone();
        Box::pin(async move { conn.query::<()>(&cmd).await })
    }
}

impl Conn {
    /// Send `cmd`; once more at once if the connection turned out to be broken (the manager
    /// has started a new one by then: a Redis that came back is used on this call, not the next).
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, L2Error> {
        let mut c = self.get().await?;
        match cmd.query_async(&mut c).await {
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                cmd.query_async(&mut c).await.map_err(failed)
            }
            r => r.map_err(failed),
        }
    }
}

/// The gateway's L2 over the config's Redis, if it has one.
pub fn build(cfg: Option<&RedisConfig>) -> Result<Option<Arc<L2>>, ConfigError> {
    let Some(cfg) = cfg else { return Ok(None) };
    let store = Arc::new(RedisStore::new(cfg)?);
    Ok(Some(Arc::new(L2::new(store, L2Policy::from(cfg)))))
}

impl fanout_ratelimit::redis::Connect for Conn {
    fn connection(&self) -> BoxFuture<'_, Result<ConnectionManager, redis::RedisError>> {
        Box::pin(async move {
            self.manager
                .get_or_try_init(|| async {
                    ConnectionManager::new_lazy_with_config(
                        self.client.clone(),
                        self.config.clone(),
                    )
                })
                .await
                .cloned()
        })
    }
}

/// A connection to the config's Redis for the rate limits (`rate_limits.*.store: redis`): the
/// same setup as the caches', its own multiplexed connection, so a decision never queues behind
/// a large cached answer.
pub fn rate_limit_connection(
    cfg: &RedisConfig,
) -> Result<Arc<dyn fanout_ratelimit::redis::Connect>, ConfigError> {
    Ok(RedisStore::new(cfg)?.0)
}
