//! The shared store: one GCRA decision per request in Redis, atomic by a server-side script
//! (EVALSHA, loaded on first use) that reads Redis's own clock (`TIME`), so the instances of a
//! fleet need no agreement on time. A key lives as long as its budget takes to refill.

use crate::StoreError;
use crate::gcra::{Decision, Gcra};
use futures_util::future::BoxFuture;
use redis::aio::ConnectionManager;
use std::time::Duration;

/// How the limiter gets its Redis connection (the gateway's `redis:` connection setup).
pub trait Connect: Send + Sync + 'static {
    /// The connection (multiplexed; made on first use).
    fn connection(&self) -> BoxFuture<'_, Result<ConnectionManager, redis::RedisError>>;
}

/// KEYS[1] the key; ARGV[1] the emission interval, ARGV[2] the tolerance (µs).
/// Returns {allowed (0/1), remaining, reset µs, retry_after µs}.
const SCRIPT: &str = r"
pcall(redis.replicate_commands)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval
local ahead = new_tat - now
if ahead > tolerance then
  local spare = tolerance - (tat - now)
  if spare < 0 then spare = 0 end
  return {0, math.floor(spare / interval), tat - now, ahead - tolerance}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil(ahead / 1000) + 1)
return {1, math.floor((tolerance - ahead) / interval), ahead, 0}
";

/// The GCRA script, called by its SHA (EVALSHA) once loaded (`SCRIPT LOAD`, again when Redis
/// has forgotten it: a restart, `SCRIPT FLUSH`).
#[derive(Default)]
pub struct RedisGcra {
    sha: std::sync::Mutex<Option<String>>,
}

impl RedisGcra {
    /// Decide one request for `key` (the full Redis key) under `gcra`.
    pub async fn decide(
        &self,
        conn: &dyn Connect,
        key: &str,
        gcra: &Gcra,
    ) -> Result<Decision, StoreError> {
        let mut c = conn.connection().await.map_err(StoreError::from)?;
        let interval = (gcra.interval_ns() / 1000).max(1);
        let tolerance = interval.saturating_mul(gcra.burst());
        let known = self.sha.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let sha = match known {
            Some(sha) => sha,
            None => self.load(&mut c).await?,
        };
        let evalsha = |sha: &str| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(1).arg(key).arg(interval).arg(tolerance);
            cmd
        };
        let r: Vec<i64> = match evalsha(&sha).query_async(&mut c).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let sha = self.load(&mut c).await?;
                evalsha(&sha).query_async(&mut c).await?
            }
            r => r?,
        };
        let [allowed, remaining, reset, retry] = r[..] else {
            return Err(StoreError::BadReply(r.len()));
        };
        let us = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
        Ok(Decision {
            allowed: allowed == 1,
            remaining: u64::try_from(remaining).unwrap_or(0),
            reset: us(reset),
            retry_after: us(retry),
        })
    }

    /// `SCRIPT LOAD`: the script's SHA, kept for the next calls.
    async fn load(&self, c: &mut ConnectionManager) -> Result<String, StoreError> {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SCRIPT)
            .query_async(c)
            .await?;
        *self.sha.lock().unwrap_or_else(|p| p.into_inner()) = Some(sha.clone());
        Ok(sha)
    }
}
