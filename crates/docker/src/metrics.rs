//! The updater's metrics, as `prometheus-client` metrics the binary registers.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The label of an event counter: the event's action (`start`, `die`, …, `other`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ActionLabel {
    pub(crate) action: &'static str,
}

/// The label of a repair counter: `added` or `removed`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ChangeLabel {
    pub(crate) change: &'static str,
}

/// Every metric of one updater; clones share the values.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) containers: Gauge,
    pub(crate) events: Family<ActionLabel, Counter>,
    pub(crate) reconnects: Counter,
    pub(crate) reconciles: Counter,
    pub(crate) repairs: Family<ChangeLabel, Counter>,
    pub(crate) bad_labels: Counter,
    pub(crate) inspect_failures: Counter,
}

impl Metrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "dwara_docker_containers_registered",
            "Containers that have at least one name registered by the Docker updater",
            self.containers.clone(),
        );
        registry.register(
            "dwara_docker_events",
            "Docker events handled, by action",
            self.events.clone(),
        );
        registry.register(
            "dwara_docker_reconnects",
            "Times the Docker event stream ended and was opened again",
            self.reconnects.clone(),
        );
        registry.register(
            "dwara_docker_reconciles",
            "Reconciliations of the records with the running containers",
            self.reconciles.clone(),
        );
        registry.register(
            "dwara_docker_reconcile_repairs",
            "Records a reconciliation added or removed",
            self.repairs.clone(),
        );
        registry.register(
            "dwara_docker_bad_labels",
            "Container inspections that found a dwara.port or dwara.service label not valid (the names are registered without a service)",
            self.bad_labels.clone(),
        );
        registry.register(
            "dwara_docker_inspect_failures",
            "Container inspections that failed (not answered within the request timeout, or refused); each such container is inspected again",
            self.inspect_failures.clone(),
        );
    }

    pub(crate) fn event(&self, action: &str) {
        let action = match action {
            "start" => "start",
            "die" => "die",
            "destroy" => "destroy",
            "rename" => "rename",
            "restart" => "restart",
            "connect" => "connect",
            "disconnect" => "disconnect",
            _ => "other",
        };
        self.events.get_or_create(&ActionLabel { action }).inc();
    }

    pub(crate) fn repaired(&self, added: u64, removed: u64) {
        self.repairs
            .get_or_create(&ChangeLabel { change: "added" })
            .inc_by(added);
        self.repairs
            .get_or_create(&ChangeLabel { change: "removed" })
            .inc_by(removed);
    }
}
