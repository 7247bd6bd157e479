//! `protos:` — the `.proto` files a config's gRPC routes, backends and stubs use, compiled in
//! process at start and on reload (no `protoc`, no code generation). The same section in
//! `fanout.yaml` and `stubs.yaml`.

use crate::Located;
use schemars::JsonSchema;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The `.proto` files to load and where their imports are found.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProtosConfig {
    /// Files to load, named relative to an `include` directory (as `protoc` names them, e.g.
    /// `demo/v1/users.proto`). Their services, methods and messages are what `grpc:` routes and
    /// calls may name. `google/protobuf/*.proto` (the well-known types) are always available.
    #[serde(default)]
    pub files: Vec<Located<String>>,
    /// Directories searched for `files` and their imports, in order; relative ones are relative
    /// to the config file's directory. Default: the config file's directory.
    #[serde(default)]
    pub include: Vec<Located<String>>,
    /// Largest `.proto` file read, in bytes. Default 1 MiB.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// Most `.proto` files read, imports included. Default 1000.
    #[serde(default = "default_max_files")]
    pub max_files: usize,
}

fn default_max_file_bytes() -> u64 {
    1 << 20
}

fn default_max_files() -> usize {
    1000
}

impl ProtosConfig {
    /// Whether any file is named.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The files and include directories, resolved against `base` (the config file's
    /// directory; `None` for a config that came from no file: the current directory).
    pub fn resolve(&self, base: Option<&Path>) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let base = base
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let mut include: Vec<PathBuf> = self.include.iter().map(|i| base.join(&i.value)).collect();
        if include.is_empty() {
            include.push(base);
        }
        let files = self.files.iter().map(|f| PathBuf::from(&f.value)).collect();
        (files, include)
    }
}

/// The directory of a config file named `file` (`None` for embedded configs and stdin).
pub fn config_dir(file: &str) -> Option<PathBuf> {
    if file.is_empty() || file.starts_with('<') || file == "-" {
        return None;
    }
    let p = Path::new(file).parent()?;
    Some(if p.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        p.to_path_buf()
    })
}
