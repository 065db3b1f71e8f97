//! The experiment as the hyperparameters loggers record (W&B's config, MLflow's params, a registered
//! logger's `config`): the typed config, plus what only `schema::extract` holds: a registered model's,
//! dataset's, loss's, optimizer's or schedule's `_target_` and arguments, which serde's view skips.

use super::{Experiment, RegisteredSpec};
use serde_json::{Map, Value};

impl Experiment {
    /// The typed config as JSON, each registered section with its `_target_` and arguments in it.
    pub fn hparams(&self) -> serde_json::Result<Value> {
        let mut config = serde_json::to_value(self)?;
        let Some(sections) = config.as_object_mut() else {
            return Ok(config);
        };
        let registered: [(&str, Option<&RegisteredSpec>); 5] = [
            ("model", self.model.registered.as_deref()),
            ("data", self.data.registered.as_ref().map(|r| &r.spec)),
            (
                "optimizer",
                self.optimizer.registered.as_ref().map(|r| &r.spec),
            ),
            (
                "scheduler",
                self.scheduler.registered.as_ref().map(|r| &r.spec),
            ),
            ("loss", self.loss.as_ref().map(|l| &l.spec)),
        ];
        for (section, spec) in registered {
            let Some(spec) = spec else { continue };
            let node = sections
                .entry(section)
                .or_insert_with(|| Value::Object(Map::new()));
            if !node.is_object() {
                *node = Value::Object(Map::new());
            }
            let node = node.as_object_mut().expect("made an object above");
            node.insert("_target_".into(), Value::String(spec.target.clone()));
            if let Value::Object(args) = &spec.args {
                for (key, value) in args {
                    node.insert(key.clone(), value.clone());
                }
            }
        }
        Ok(config)
    }
}
