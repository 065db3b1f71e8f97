//! Every way composition can fail, each a distinct variant whose message says what happened, where it was
//! written, and what to do. Messages start with Hydra 1.3's own wording so users can search for them.

use super::tree::Source;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The defaults list or an override could not be applied (Hydra's ConfigCompositionException).
    #[error("{0}")]
    Composition(String),
    /// A config file or group option does not exist (Hydra's MissingConfigException).
    #[error("{0}")]
    MissingConfig(String),
    /// An override did not parse.
    #[error("{0}")]
    Parse(String),
    /// A YAML file did not parse.
    #[error("{0}")]
    Yaml(#[from] super::yaml::YamlError),
    /// `${...}` could not be resolved.
    #[error("{0}")]
    Interpolation(String),
    /// A value does not fit the typed schema.
    #[error("{0}")]
    Schema(String),
    /// A file could not be read.
    #[error("{0}")]
    Io(String),
    /// The job itself failed (data, model, training).
    #[error("{0}")]
    Run(String),
    /// A distributed run's node did not come to the rendezvous in time (`comm::rendezvous`): the worker
    /// ends with `comm::EXIT_NODE_MISSING`, which its launcher does not restart.
    #[error("{0}")]
    NodeMissing(String),
    /// A collective of a distributed run timed out (`trainer.collective_timeout_s`): the worker ends
    /// with `comm::EXIT_COLLECTIVE_TIMEOUT`, and its launcher names the rank that stalled.
    #[error("{0}")]
    CollectiveTimeout(String),
}

impl ConfigError {
    pub fn composition(message: impl Into<String>) -> Self {
        ConfigError::Composition(message.into())
    }
    /// Short class name, matching Hydra's exception names where one exists.
    pub fn kind(&self) -> &'static str {
        match self {
            ConfigError::Composition(_) => "ConfigCompositionException",
            ConfigError::MissingConfig(_) => "MissingConfigException",
            ConfigError::Parse(_) => "OverrideParseException",
            ConfigError::Yaml(_) => "YamlError",
            ConfigError::Interpolation(_) => "InterpolationResolutionError",
            ConfigError::Schema(_) => "ValidationError",
            ConfigError::Io(_) => "IoError",
            ConfigError::Run(_) => "RunError",
            ConfigError::NodeMissing(_) => "RendezvousTimeoutException",
            ConfigError::CollectiveTimeout(_) => "DistBackendError",
        }
    }
}

/// "    (set at conf/x.yaml:3:5)" — appended to messages so the user can find the line.
pub fn at(source: &Source) -> String {
    if source.is_internal() {
        String::new()
    } else {
        format!("\n    (set at {source})")
    }
}

/// The closest candidates to `wanted`, for "did you mean" hints.
pub fn did_you_mean<'a>(
    wanted: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let mut best: Option<(f64, &str)> = None;
    for candidate in candidates {
        let score = strsim::jaro_winkler(wanted, candidate);
        if score > 0.8 && best.is_none_or(|(s, _)| score > s) {
            best = Some((score, candidate));
        }
    }
    best.map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names() {
        assert_eq!(
            did_you_mean("optimiser", ["optimizer", "model"]).as_deref(),
            Some("optimizer")
        );
        assert_eq!(did_you_mean("zzz", ["optimizer", "model"]), None);
    }
}
