//! Changing routes while the stub runs: [`RouteUpdate`] (what `PUT /__stub/routes` takes and
//! what [`StubServer::update_route`](crate::StubServer::update_route) applies) and
//! [`RouteView`] (what `GET /__stub/routes` lists).

use crate::compile::Behaviour;
use crate::config::{FaultConfig, GrpcCode, LatencyConfig};
use crate::fault::Fault;
use crate::latency::Latency;
use http::StatusCode;
use serde::{Deserialize, Serialize};

/// A change to a route: only the fields given change. Shared by the admin API (as JSON) and the
/// load lab (in process, or from its own YAML).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteUpdate {
    /// New latency model (same forms as in the config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyConfig>,
    /// New fault list (replaces the whole list; `[]` removes all faults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<Vec<FaultConfig>>,
    /// New response status. On a gRPC route, a status other than 2xx answers the gRPC code it
    /// maps to (`fanout_grpc::Code::for_answer`: 503 → UNAVAILABLE, …) unless `grpc_status`
    /// is set to another code than OK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// gRPC routes: new status answered (a name or a number; `OK` answers the message again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<GrpcCode>,
    /// gRPC routes: new `grpc-message` sent with a `grpc_status` other than OK (`""`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_message: Option<String>,
}

/// A route's current behaviour as `GET /__stub/routes` lists it; each entry is also a valid
/// `PUT /__stub/routes` body.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteView {
    /// The route key, `"METHOD PATH-PATTERN"`.
    pub route: String,
    /// Response status.
    pub status: u16,
    /// Latency model (a fixed `0ms` when the route has none).
    pub latency: LatencyConfig,
    /// Faults, in the order they are tried.
    pub faults: Vec<FaultConfig>,
    /// gRPC routes: the status answered (`OK`: the message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<GrpcCode>,
    /// gRPC routes: the `grpc-message` sent with a `grpc_status` other than OK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_message: Option<String>,
}

/// A route update was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteUpdateError {
    /// No service of that name.
    #[error("no service `{0}`")]
    NoService(String),
    /// The service has no such route.
    #[error("no route `{route}` in service `{service}`; routes are keyed \"METHOD PATH-PATTERN\"")]
    NoRoute {
        /// The service.
        service: String,
        /// The route key asked for.
        route: String,
    },
    /// The update itself is invalid (bad latency, fault or status, or `grpc_status` for an HTTP
    /// route).
    #[error("{0}")]
    Invalid(String),
}

/// A checked and compiled [`RouteUpdate`], ready to apply to a [`Behaviour`].
#[derive(Debug)]
pub(crate) struct CompiledUpdate {
    status: Option<StatusCode>,
    latency: Option<Latency>,
    faults: Option<Vec<Fault>>,
    grpc_status: Option<GrpcCode>,
    /// `Some(None)` clears the message.
    grpc_message: Option<Option<String>>,
}

impl RouteUpdate {
    /// Whether the update sets a field only gRPC routes have.
    pub(crate) fn has_grpc_fields(&self) -> bool {
        self.grpc_status.is_some() || self.grpc_message.is_some()
    }

    /// Check and compile every given field; the message names the field at fault.
    pub(crate) fn compile(&self) -> Result<CompiledUpdate, String> {
        let status = match self.status {
            None => None,
            Some(s) => Some(
                StatusCode::from_u16(s)
                    .map_err(|_| format!("status: invalid status {s} (use 100..999)"))?,
            ),
        };
        let latency = match &self.latency {
            None => None,
            Some(l) => Some(Latency::from_config(l).map_err(|e| format!("latency: {e}"))?),
        };
        let faults = match &self.faults {
            None => None,
            Some(fs) => Some(
                fs.iter()
                    .enumerate()
                    .map(|(i, f)| {
                        Fault::compile(f)
                            .map_err(|p| format!("faults[{i}]: {} (hint: {})", p.message, p.hint))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(CompiledUpdate {
            status,
            latency,
            faults,
            grpc_status: self.grpc_status,
            grpc_message: self
                .grpc_message
                .as_ref()
                .map(|m| Some(m.clone()).filter(|m| !m.is_empty())),
        })
    }
}

impl CompiledUpdate {
    /// `current` with the update's fields replaced.
    pub(crate) fn apply(&self, current: &Behaviour) -> Behaviour {
        let mut b = current.clone();
        if let Some(s) = self.status {
            b.status = s;
        }
        if let Some(l) = &self.latency {
            b.latency = l.clone();
        }
        if let Some(f) = &self.faults {
            b.faults = f.clone();
        }
        if let Some(c) = self.grpc_status {
            b.grpc_status = c.0;
        }
        if let Some(m) = &self.grpc_message {
            b.grpc_message = m.clone();
        }
        b
    }
}

impl RouteView {
    /// The view of route `route` behaving as `b` (`grpc`: whether it is a gRPC route, which
    /// shows its `grpc_status` and `grpc_message`).
    pub(crate) fn of(route: &str, b: &Behaviour, grpc: bool) -> RouteView {
        RouteView {
            route: route.to_string(),
            status: b.status.as_u16(),
            latency: b.latency.to_config(),
            faults: b.faults.iter().map(Fault::to_config).collect(),
            grpc_status: grpc.then_some(GrpcCode(b.grpc_status)),
            grpc_message: if grpc { b.grpc_message.clone() } else { None },
        }
    }
}

/// The body of `PUT /__stub/routes`: a [`RouteUpdate`] naming its route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutRoute {
    /// Route key, `"METHOD PATH-PATTERN"`.
    pub(crate) route: String,
    #[serde(default)]
    latency: Option<LatencyConfig>,
    #[serde(default)]
    faults: Option<Vec<FaultConfig>>,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    grpc_status: Option<GrpcCode>,
    #[serde(default)]
    grpc_message: Option<String>,
}

impl PutRoute {
    /// The update without the route key.
    pub(crate) fn into_update(self) -> (String, RouteUpdate) {
        (
            self.route,
            RouteUpdate {
                latency: self.latency,
                faults: self.faults,
                status: self.status,
                grpc_status: self.grpc_status,
                grpc_message: self.grpc_message,
            },
        )
    }
}
