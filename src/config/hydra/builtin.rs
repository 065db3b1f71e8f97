//! Hydra's own config groups, built into the binary: what hydra-core 1.3 ships in `hydra/conf` and its
//! `ConfigStore` (`hydra/config`, the basic launcher and sweeper), and the groups of the plugins real
//! projects name (hydra-colorlog's logging styles, hydra-optuna-sweeper's sweeper and samplers), so a conf
//! tree that says `override hydra/job_logging: colorlog` composes as it does under Hydra.
//!
//! The values are Hydra's (a `--cfg hydra` must print what Hydra prints); the `_target_`s keep Hydra's class
//! names so configs that refer to them keep working, while trainyard picks its launcher and sweeper by the
//! chosen option (`hydra.runtime.choices`), not by `_target_`.

/// One built-in config: its config path (`hydra/launcher/basic`), the provider and source it is listed
/// under in the search path, whether it is searched before the user's configs, and its YAML.
#[derive(Debug)]
pub struct BuiltinConfig {
    pub config_path: &'static str,
    pub source: &'static BuiltinSource,
    pub text: &'static str,
}

/// A search-path entry for built-in configs, as Hydra lists it (`--info searchpath`).
#[derive(Debug)]
pub struct BuiltinSource {
    pub provider: &'static str,
    pub path: &'static str,
    /// Hydra's own YAML (`pkg://hydra.conf`) comes before the user's configs; plugin and structured
    /// configs after them, so a project may shadow them with its own file.
    pub before_user: bool,
}

pub static HYDRA_CONF: BuiltinSource = BuiltinSource {
    provider: "hydra",
    path: "pkg://hydra.conf",
    before_user: true,
};
pub static COLORLOG: BuiltinSource = BuiltinSource {
    provider: "hydra-colorlog",
    path: "pkg://hydra_plugins.hydra_colorlog.conf",
    before_user: false,
};
pub static STRUCTURED: BuiltinSource = BuiltinSource {
    provider: "schema",
    path: "structured://",
    before_user: false,
};

/// Every built-in config, in search order within each source.
pub static BUILTIN: &[BuiltinConfig] = &[
    BuiltinConfig {
        config_path: "hydra/env/default",
        source: &HYDRA_CONF,
        text: "",
    },
    BuiltinConfig {
        config_path: "hydra/help/default",
        source: &HYDRA_CONF,
        text: HELP,
    },
    BuiltinConfig {
        config_path: "hydra/hydra_help/default",
        source: &HYDRA_CONF,
        text: HYDRA_HELP,
    },
    BuiltinConfig {
        config_path: "hydra/hydra_logging/default",
        source: &HYDRA_CONF,
        text: HYDRA_LOGGING_DEFAULT,
    },
    BuiltinConfig {
        config_path: "hydra/hydra_logging/disabled",
        source: &HYDRA_CONF,
        text: LOGGING_DISABLED,
    },
    BuiltinConfig {
        config_path: "hydra/hydra_logging/hydra_debug",
        source: &HYDRA_CONF,
        text: HYDRA_LOGGING_DEBUG,
    },
    BuiltinConfig {
        config_path: "hydra/hydra_logging/none",
        source: &HYDRA_CONF,
        text: LOGGING_NONE,
    },
    BuiltinConfig {
        config_path: "hydra/job_logging/default",
        source: &HYDRA_CONF,
        text: JOB_LOGGING_DEFAULT,
    },
    BuiltinConfig {
        config_path: "hydra/job_logging/disabled",
        source: &HYDRA_CONF,
        text: LOGGING_DISABLED,
    },
    BuiltinConfig {
        config_path: "hydra/job_logging/none",
        source: &HYDRA_CONF,
        text: LOGGING_NONE,
    },
    BuiltinConfig {
        config_path: "hydra/job_logging/stdout",
        source: &HYDRA_CONF,
        text: JOB_LOGGING_STDOUT,
    },
    BuiltinConfig {
        config_path: "hydra/output/default",
        source: &HYDRA_CONF,
        text: OUTPUT_DEFAULT,
    },
    BuiltinConfig {
        config_path: "hydra/hydra_logging/colorlog",
        source: &COLORLOG,
        text: HYDRA_LOGGING_COLORLOG,
    },
    BuiltinConfig {
        config_path: "hydra/job_logging/colorlog",
        source: &COLORLOG,
        text: JOB_LOGGING_COLORLOG,
    },
    BuiltinConfig {
        config_path: "hydra/config",
        source: &STRUCTURED,
        text: HYDRA_CONFIG,
    },
    BuiltinConfig {
        config_path: "hydra/launcher/basic",
        source: &STRUCTURED,
        text: "_target_: hydra._internal.core_plugins.basic_launcher.BasicLauncher\n",
    },
    BuiltinConfig {
        config_path: "hydra/launcher/submitit_slurm",
        source: &STRUCTURED,
        text: SUBMITIT_SLURM,
    },
    BuiltinConfig {
        config_path: "hydra/launcher/submitit_local",
        source: &STRUCTURED,
        text: SUBMITIT_LOCAL,
    },
    BuiltinConfig {
        config_path: "hydra/launcher/joblib",
        source: &STRUCTURED,
        text: JOBLIB,
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/basic",
        source: &STRUCTURED,
        text: "_target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n\
               max_batch_size: null\nparams: null\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/optuna",
        source: &STRUCTURED,
        text: OPTUNA_SWEEPER,
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/sampler/tpe",
        source: &STRUCTURED,
        text: "_target_: optuna.samplers.TPESampler\nseed: null\nconsider_prior: true\n\
               prior_weight: 1.0\nconsider_magic_clip: true\nconsider_endpoints: false\n\
               n_startup_trials: 10\nn_ei_candidates: 24\nmultivariate: false\n\
               warn_independent_sampling: true\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/sampler/random",
        source: &STRUCTURED,
        text: "_target_: optuna.samplers.RandomSampler\nseed: null\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/sampler/cmaes",
        source: &STRUCTURED,
        text: "_target_: optuna.samplers.CmaEsSampler\nseed: null\nx0: null\nsigma0: null\n\
               independent_sampler: null\nwarn_independent_sampling: true\n\
               consider_pruned_trials: false\nrestart_strategy: null\ninc_popsize: 2\n\
               use_separable_cma: false\nsource_trials: null\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/sampler/nsgaii",
        source: &STRUCTURED,
        text: "_target_: optuna.samplers.NSGAIISampler\nseed: null\npopulation_size: 50\n\
               mutation_prob: null\ncrossover_prob: 0.9\nswapping_prob: 0.5\n\
               constraints_func: null\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/sampler/motpe",
        source: &STRUCTURED,
        text: "_target_: optuna.samplers.MOTPESampler\nseed: null\nconsider_prior: true\n\
               prior_weight: 1.0\nconsider_magic_clip: true\nconsider_endpoints: false\n\
               n_startup_trials: 10\nn_ehvi_candidates: 24\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/pruner/median",
        source: &STRUCTURED,
        text: "_target_: optuna.pruners.MedianPruner\nn_startup_trials: 5\nn_warmup_steps: 0\n\
               interval_steps: 1\nn_min_trials: 1\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/pruner/nop",
        source: &STRUCTURED,
        text: "_target_: optuna.pruners.NopPruner\n",
    },
    BuiltinConfig {
        config_path: "hydra/sweeper/sampler/grid",
        source: &STRUCTURED,
        text: "_target_: optuna.samplers.GridSampler\n_partial_: true\n",
    },
];

/// `HydraConf`: the `hydra` node's schema and its defaults list (Hydra composes it under every primary
/// config). `???` fields are filled by the chosen options or at run time.
const HYDRA_CONFIG: &str = r#"defaults:
  - output: default
  - launcher: basic
  - sweeper: basic
  - help: default
  - hydra_help: default
  - hydra_logging: default
  - job_logging: default
  - callbacks: null
  - env: default
mode: null
searchpath: []
run:
  dir: ???
sweep:
  dir: ???
  subdir: ???
hydra_logging: ???
job_logging: ???
sweeper: ???
launcher: ???
callbacks: {}
help:
  app_name: ???
  header: ???
  footer: ???
  template: ???
hydra_help:
  hydra_help: ???
  template: ???
output_subdir: .hydra
overrides:
  hydra: []
  task: []
job:
  name: ???
  chdir: null
  override_dirname: ???
  id: ???
  num: ???
  config_name: ???
  env_set: {}
  env_copy: []
  config:
    override_dirname:
      kv_sep: '='
      item_sep: ','
      exclude_keys: []
runtime:
  version: ???
  version_base: ???
  cwd: ???
  config_sources: ???
  output_dir: ???
  choices: {}
verbose: false
"#;

const OUTPUT_DEFAULT: &str = r#"# @package hydra
run:
  dir: outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}
sweep:
  dir: multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}
  subdir: ${hydra.job.num}
"#;

const HELP: &str = r#"app_name: ${hydra.job.name}
header: |
  ${hydra.help.app_name} is powered by Hydra.
footer: |
  Powered by Hydra (https://hydra.cc)
  Use --hydra-help to view Hydra specific help
template: |
  ${hydra.help.header}
  == Configuration groups ==
  Compose your configuration from those groups (group=option)

  $APP_CONFIG_GROUPS

  == Config ==
  Override anything in the config (foo.bar=value)

  $CONFIG

  ${hydra.help.footer}
"#;

const HYDRA_HELP: &str = r#"template: |
  Hydra (${hydra.runtime.version})
  See https://hydra.cc for more info.

  == Flags ==
  $FLAGS_HELP

  == Configuration groups ==
  Compose your configuration from those groups (For example, append hydra/job_logging=disabled to command line)

  $HYDRA_CONFIG_GROUPS

  Use '--cfg hydra' to Show the Hydra config.
"#;

const HYDRA_LOGGING_DEFAULT: &str = r#"version: 1
formatters:
  simple:
    format: "[%(asctime)s][HYDRA] %(message)s"
handlers:
  console:
    class: logging.StreamHandler
    formatter: simple
    stream: ext://sys.stdout
root:
  level: INFO
  handlers: [console]
loggers:
  logging_example:
    level: DEBUG
disable_existing_loggers: false
"#;

const HYDRA_LOGGING_DEBUG: &str = r#"version: 1
formatters:
  simple:
    format: '[%(asctime)s][%(name)s][%(levelname)s] - %(message)s'
handlers:
  file:
    class: logging.FileHandler
    mode: w
    formatter: simple
    filename: hydra-${hydra.job.name}.log
    delay: true
root:
  level: ERROR
  handlers: [file]
loggers:
  hydra:
    level: DEBUG
disable_existing_loggers: false
"#;

const LOGGING_DISABLED: &str =
    "version: 1\nroot:\n  level: ERROR\ndisable_existing_loggers: true\n";

const LOGGING_NONE: &str = "version: 1\nroot: null\ndisable_existing_loggers: false\n";

const JOB_LOGGING_DEFAULT: &str = r#"version: 1
formatters:
  simple:
    format: '[%(asctime)s][%(name)s][%(levelname)s] - %(message)s'
handlers:
  console:
    class: logging.StreamHandler
    formatter: simple
    stream: ext://sys.stdout
  file:
    class: logging.FileHandler
    formatter: simple
    filename: ${hydra.runtime.output_dir}/${hydra.job.name}.log
root:
  level: INFO
  handlers: [console, file]
disable_existing_loggers: false
"#;

const JOB_LOGGING_STDOUT: &str = r#"version: 1
formatters:
  simple:
    format: '%(message)s'
handlers:
  console:
    class: logging.StreamHandler
    formatter: simple
    stream: ext://sys.stdout
root:
  level: INFO
  handlers: [console]
disable_existing_loggers: false
"#;

const HYDRA_LOGGING_COLORLOG: &str = r#"# @package hydra.hydra_logging
version: 1
formatters:
  colorlog:
    '()': 'colorlog.ColoredFormatter'
    format: "[%(cyan)s%(asctime)s%(reset)s][%(purple)sHYDRA%(reset)s] %(message)s"
handlers:
  console:
    class: logging.StreamHandler
    formatter: colorlog
    stream: ext://sys.stdout
root:
  level: INFO
  handlers: [console]
disable_existing_loggers: false
"#;

const JOB_LOGGING_COLORLOG: &str = r#"# @package hydra.job_logging
version: 1
formatters:
  simple:
    format: '[%(asctime)s][%(name)s][%(levelname)s] - %(message)s'
  colorlog:
    '()': 'colorlog.ColoredFormatter'
    format: '[%(cyan)s%(asctime)s%(reset)s][%(blue)s%(name)s%(reset)s][%(log_color)s%(levelname)s%(reset)s] - %(message)s'
    log_colors:
      DEBUG: purple
      INFO: green
      WARNING: yellow
      ERROR: red
      CRITICAL: red
handlers:
  console:
    class: logging.StreamHandler
    formatter: colorlog
    stream: ext://sys.stdout
  file:
    class: logging.FileHandler
    formatter: simple
    filename: ${hydra.job.name}.log
root:
  level: INFO
  handlers: [console, file]
disable_existing_loggers: false
"#;

const OPTUNA_SWEEPER: &str = r#"defaults:
  - sampler: tpe
_target_: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper
sampler: ???
direction: minimize
storage: null
study_name: null
n_trials: 20
n_jobs: 2
max_failure_rate: 0.0
search_space: null
params: null
custom_search_space: null
"#;

/// hydra-submitit-launcher 1.2's `SlurmQueueConf` (its `BaseQueueConf` fields first, as Hydra prints them).
const SUBMITIT_SLURM: &str = "\
submitit_folder: ${hydra.sweep.dir}/.submitit/%j
timeout_min: 60
cpus_per_task: null
gpus_per_node: null
tasks_per_node: 1
mem_gb: null
nodes: 1
name: ${hydra.job.name}
stderr_to_stdout: false
_target_: hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher
partition: null
qos: null
comment: null
constraint: null
exclude: null
gres: null
cpus_per_gpu: null
gpus_per_task: null
mem_per_gpu: null
mem_per_cpu: null
account: null
signal_delay_s: 120
max_num_timeout: 0
additional_parameters: {}
array_parallelism: 256
setup: null
";

/// hydra-submitit-launcher 1.2's `LocalQueueConf`.
const SUBMITIT_LOCAL: &str = "\
submitit_folder: ${hydra.sweep.dir}/.submitit/%j
timeout_min: 60
cpus_per_task: null
gpus_per_node: null
tasks_per_node: 1
mem_gb: null
nodes: 1
name: ${hydra.job.name}
stderr_to_stdout: false
_target_: hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher
";

/// hydra-joblib-launcher 1.2's `JobLibLauncherConf`.
const JOBLIB: &str = "\
_target_: hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher
n_jobs: -1
backend: null
prefer: processes
require: null
verbose: 0
timeout: null
pre_dispatch: 2*n_jobs
batch_size: auto
temp_folder: null
max_nbytes: null
mmap_mode: r
";
