//! Config errors with their position in the file.

use crate::Pos;
use std::fmt;

/// A config error with its position. Display: `FILE:LINE:COL: message` and an indented hint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// File name as given by the user (`"<embedded>"` for built-in configs).
    pub file: String,
    /// Position (1-based line and column); `None` when the error concerns the whole file.
    pub pos: Option<Pos>,
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
    /// Where in the config the mistake is, as a path (`compression.response.levels.gzip`,
    /// `server.trusted_proxies[1]`), for an error made without a position: [`locate`] turns it
    /// into the position of that key in the file.
    pub path: Option<String>,
}

impl ConfigError {
    /// An error at `pos` (file is filled in by the loader).
    pub fn at(pos: Pos, message: impl Into<String>) -> Self {
        ConfigError {
            path: None,
            file: String::new(),
            pos: Some(pos),
            message: message.into(),
            hint: None,
        }
    }
    /// An error at the config's key `path` (dotted, `[i]` for a list element): its position
    /// is found in the file's text when the errors are reported ([`locate`]).
    pub fn at_path(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            path: Some(path.into()),
            file: String::new(),
            pos: None,
            message: message.into(),
            hint: None,
        }
    }
    /// Attach a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    /// Set the file name.
    pub fn in_file(mut self, file: &str) -> Self {
        self.file = file.to_string();
        self
    }
}

/// Give each error of `errs` made at a path ([`ConfigError::at_path`]) or without a position
/// the position of its path's key in `source` (the config's text): of the deepest part of the
/// path the file has, so a default that was never written points at its section.
pub fn locate(errs: &mut [ConfigError], source: &str) {
    if !errs
        .iter()
        .any(|e| e.path.is_some() && e.pos.is_none_or(|p| p.line == 0))
    {
        return;
    }
    let tree = crate::unknown::Tree::parse(source);
    for e in errs.iter_mut() {
        if let Some(path) = &e.path
            && e.pos.is_none_or(|p| p.line == 0)
            && let Some(p) = tree.as_ref().and_then(|t| t.position_of(path))
        {
            e.pos = Some(p);
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.col, self.message)?,
            None => write!(f, "{}: {}", self.file, self.message)?,
        }
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

/// A list of config errors (validation reports all it can find).
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    /// Each error once: the same mistake found again (in a YAML anchor's text that several
    /// routes use through aliases or `<<` merges, each checked on its own) is not repeated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if self.0[..i].contains(e) {
                continue;
            }
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}
