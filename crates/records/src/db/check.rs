//! [`Db::verify`]: every table and index the edit path keeps in step, recomputed
//! from the records by the rules' definitions (the slow way, O(database) and
//! quadratic in a name's records) and compared. For tests and fuzzing.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::answers::Rec;
use crate::health::{Health, HealthFailMode};

use super::index::{Counts, INDEX_MIN};
use super::{Db, Writer, text_of_wire};

/// A table or index that disagrees with the records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {what}")]
pub struct Inconsistency {
    /// The name (or address) whose state is wrong.
    pub name: String,
    /// What is wrong.
    pub what: String,
}

fn wrong(name: &[u8], what: String) -> Inconsistency {
    Inconsistency {
        name: text_of_wire(name),
        what,
    }
}

/// The serve flags of `recs` by their definition: the first servable record of its
/// address; of its (service, address, port); of its (service, address) among those.
pub(super) fn flags_by_definition(
    w: &Writer,
    mode: HealthFailMode,
    recs: &[Rec],
) -> Vec<(bool, bool, bool)> {
    let visible = |r: &Rec| !r.tombstone && !w.hidden(r.origin);
    let fail_open =
        mode == HealthFailMode::Open && !recs.iter().any(|r| visible(r) && r.health.passing());
    let servable: Vec<bool> = recs
        .iter()
        .map(|r| visible(r) && (r.health.passing() || (fail_open && r.health == Health::Unhealthy)))
        .collect();
    let key = |r: &Rec| {
        r.service
            .as_ref()
            .map(|s| (s.labels.clone(), r.ip, s.spec.port()))
    };
    (0..recs.len())
        .map(|i| {
            let r = &recs[i];
            let earlier = |same: &dyn Fn(usize) -> bool| (0..i).any(|j| servable[j] && same(j));
            let serve = servable[i] && !earlier(&|j| recs[j].ip == r.ip);
            let srv_serve =
                servable[i] && key(r).is_some() && !earlier(&|j| key(&recs[j]) == key(r));
            let srv_addr = srv_serve
                && !earlier(&|j| {
                    key(&recs[j]).map(|(l, ip, _)| (l, ip)) == key(r).map(|(l, ip, _)| (l, ip))
                });
            (serve, srv_serve, srv_addr)
        })
        .collect()
}

impl Db {
    /// Recomputes from the records, by their definitions, what the edit path keeps
    /// incrementally (the serve flags, each large name's index and counts, the PTR
    /// index, the answered-descendant counts, the live count) and returns the
    /// first disagreement. O(database); for tests and fuzzing.
    pub fn verify(&self) -> Result<(), Inconsistency> {
        let w = self.writer.lock();
        let mut names = Vec::new();
        self.tables.names.for_each(|name, recs| {
            names.push((name.clone(), recs.clone()));
        });
        let mut live = 0;
        let mut descendants: HashMap<Box<[u8]>, u32> = HashMap::new();
        let domain = self.config.domain.wire().len();
        for (name, recs) in &names {
            self.verify_name(&w, name, recs)?;
            live += recs.iter().filter(|r| !r.tombstone).count();
            if recs.iter().any(|r| r.serve) {
                let mut pos = 0;
                loop {
                    pos += 1 + usize::from(name[pos]);
                    if pos >= name.len() || name.len() - pos <= domain {
                        break;
                    }
                    *descendants.entry(name[pos..].into()).or_default() += 1;
                }
            }
        }
        if live != w.live {
            return Err(wrong(b"\0", format!("live count {} for {live}", w.live)));
        }
        if let Some(extra) = w
            .indexes
            .keys()
            .find(|k| !names.iter().any(|(n, _)| n == *k))
        {
            return Err(wrong(extra, "an index for a name without records".into()));
        }
        let mut kept = HashMap::new();
        self.tables.descendants.for_each(|k, n| {
            kept.insert(k.clone(), *n);
        });
        if kept != descendants {
            return Err(wrong(
                b"\0",
                format!("descendants {kept:?} for {descendants:?}"),
            ));
        }
        self.verify_ptr(&names)
    }

    fn verify_name(&self, w: &Writer, name: &[u8], recs: &[Rec]) -> Result<(), Inconsistency> {
        let got: Vec<_> = recs
            .iter()
            .map(|r| (r.serve, r.srv_serve, r.srv_addr))
            .collect();
        let want = flags_by_definition(w, self.config.health_fail, recs);
        if got != want {
            return Err(wrong(name, format!("flags {got:?} for {want:?}")));
        }
        match w.indexes.get(name) {
            None if recs.len() < INDEX_MIN => Ok(()),
            None => Err(wrong(name, format!("no index for {} records", recs.len()))),
            Some(_) if recs.len() < INDEX_MIN => {
                Err(wrong(name, format!("an index for {} records", recs.len())))
            }
            Some(ix) if !ix.matches(recs) => Err(wrong(name, "index positions".into())),
            Some(ix) => {
                let counts = Counts {
                    passing: recs.iter().filter(|r| super::edit::passing(w, r)).count(),
                    served: recs.iter().filter(|r| r.serve).count(),
                };
                if ix.counts == counts {
                    Ok(())
                } else {
                    Err(wrong(
                        name,
                        format!("counts {:?} for {counts:?}", ix.counts),
                    ))
                }
            }
        }
    }

    /// Every (name, address) pair is in the address index, answered iff a record
    /// of that address is; the index holds no other pair.
    fn verify_ptr(
        &self,
        names: &[(crate::answers::NameRef, Vec<Rec>)],
    ) -> Result<(), Inconsistency> {
        let mut pairs = 0;
        for (name, recs) in names {
            let mut ips: Vec<IpAddr> = recs.iter().map(|r| r.ip).collect();
            ips.sort_unstable();
            ips.dedup();
            for ip in ips {
                pairs += 1;
                let served = recs.iter().any(|r| r.ip == ip && r.serve);
                let refs = self.tables.addr_refs(ip);
                match refs.iter().filter(|p| p.name == *name).count() {
                    1 if refs.iter().any(|p| p.name == *name && p.serve == served) => {}
                    n => {
                        return Err(wrong(
                            name,
                            format!("{n} PTR entries at {ip}, answered: {served}"),
                        ));
                    }
                }
            }
        }
        let mut kept = 0;
        self.tables.v4.for_each(|_, refs| kept += refs.len());
        self.tables.v6.for_each(|_, refs| kept += refs.len());
        if kept != pairs {
            return Err(wrong(b"\0", format!("{kept} PTR entries for {pairs}")));
        }
        Ok(())
    }
}
