//! TEMPORARY placeholder until the typed schema lands.
use crate::config::errors::ConfigError;
use crate::config::tree::Node;
pub struct Named {
    pub name: String,
}
pub struct Trainer {
    pub strategy: String,
}
pub struct Experiment {
    pub task_name: String,
    pub model: Named,
    pub data: Named,
    pub trainer: Trainer,
}
pub fn extract(config: &Node) -> Result<Experiment, ConfigError> {
    let get = |k: &str| {
        config
            .get(k)
            .and_then(Node::as_str)
            .map(str::to_string)
            .ok_or_else(|| ConfigError::Schema(format!("Missing key {k}")))
    };
    Ok(Experiment {
        task_name: get("task_name")?,
        model: Named {
            name: get("model.name")?,
        },
        data: Named {
            name: get("data.name")?,
        },
        trainer: Trainer {
            strategy: get("trainer.strategy")?,
        },
    })
}
