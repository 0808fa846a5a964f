//! Wiring of `dwara-docker` into `dwara serve`: flags over the config file's
//! `docker:` section over the defaults (`auto`: on when the socket exists).

use std::path::PathBuf;

use clap::Args;
use dwara_docker::{DockerConfig, DockerMode, NameSources};

use dwara::config::DockerSection;

/// Docker flags of `dwara serve`.
#[derive(Debug, Args)]
pub(crate) struct DockerArgs {
    /// Register running containers: auto (when the socket exists), on (fail without a
    /// daemon) or off [default: auto]
    #[arg(long = "docker", value_name = "auto|on|off")]
    mode: Option<DockerMode>,
    /// The Docker daemon's unix socket [default: DOCKER_HOST if unix://, else
    /// /var/run/docker.sock]
    #[arg(long, value_name = "PATH")]
    docker_socket: Option<PathBuf>,
    /// Register the addresses of this Docker network only [default: every network]
    #[arg(long, value_name = "NAME")]
    docker_network: Option<String>,
    /// Names to register, comma-separated: hostname (Hostname.Domainname), name,
    /// aliases [default: hostname]
    #[arg(long, value_name = "LIST")]
    docker_names: Option<NameSources>,
}

impl DockerArgs {
    /// These flags over the `docker:` section over the defaults. The section's
    /// values were checked when the file was loaded.
    pub(crate) fn config(&self, section: Option<&DockerSection>) -> anyhow::Result<DockerConfig> {
        let empty = DockerSection::default();
        let file = section.unwrap_or(&empty);
        let mut config = DockerConfig::new();
        if let Some(socket) = self.docker_socket.clone().or_else(|| file.socket.clone()) {
            config.socket = socket;
        }
        config.mode = match (self.mode, &file.mode) {
            (Some(flag), _) => flag,
            (None, Some(from_file)) => from_file.parse()?,
            (None, None) => DockerMode::Auto,
        };
        config.names = match (&self.docker_names, &file.names) {
            (Some(flag), _) => flag.clone(),
            (None, Some(from_file)) => from_file.parse()?,
            (None, None) => NameSources::default(),
        };
        config.network = self.docker_network.clone().or_else(|| file.network.clone());
        Ok(config)
    }
}
