//! The limits of an operation, checked before anything is called: depth, aliases, fields and
//! an estimated cost (every field 1, times the assumed sizes of the lists above it). Fragments
//! count where they are spread; the walk stops at the first limit passed, so a document that
//! spreads fragments exponentially costs no more than the limits allow. The introspection
//! fields (`__schema`, `__type`) are bounded by apollo-compiler's own depth check instead.

use apollo_compiler::ExecutableDocument;
use apollo_compiler::executable::{Selection, SelectionSet};
use fanout_config::GraphqlLimits;

/// A limit the operation passes: its `extensions.code`, the limit's config name and message.
pub(crate) struct Exceeded {
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

struct Walk<'a> {
    doc: &'a ExecutableDocument,
    limits: &'a GraphqlLimits,
    fields: usize,
    aliases: usize,
    cost: u64,
    /// Fragment spreads followed (each bounded by the fields they add, and this).
    spreads: usize,
}

/// Check `set` (an operation's selection set) against `limits`: its estimated cost.
pub(crate) fn check(
    doc: &ExecutableDocument,
    set: &SelectionSet,
    limits: &GraphqlLimits,
) -> Result<u64, Exceeded> {
    let mut w = Walk {
        doc,
        limits,
        fields: 0,
        aliases: 0,
        cost: 0,
        spreads: 0,
    };
    w.set(set, 1, 1)?;
    Ok(w.cost)
}

impl Walk<'_> {
    fn set(&mut self, set: &SelectionSet, depth: usize, mult: u64) -> Result<(), Exceeded> {
        for sel in &set.selections {
            match sel {
                Selection::Field(f) => {
                    if depth == 1 && matches!(f.name.as_str(), "__schema" | "__type") {
                        continue;
                    }
                    if depth > self.limits.max_depth {
                        return Err(Exceeded {
                            code: "MAX_DEPTH_EXCEEDED",
                            message: format!(
                                "the operation is nested deeper than graphql.limits.max_depth ({})",
                                self.limits.max_depth
                            ),
                        });
                    }
                    self.fields += 1;
                    if self.fields > self.limits.max_fields {
                        return Err(Exceeded {
                            code: "MAX_FIELDS_EXCEEDED",
                            message: format!(
                                "the operation selects more fields than graphql.limits.max_fields ({})",
                                self.limits.max_fields
                            ),
                        });
                    }
                    if f.alias.is_some() {
                        self.aliases += 1;
                        if self.aliases > self.limits.max_aliases {
                            return Err(Exceeded {
                                code: "MAX_ALIASES_EXCEEDED",
                                message: format!(
                                    "the operation has more aliases than graphql.limits.max_aliases ({})",
                                    self.limits.max_aliases
                                ),
                            });
                        }
                    }
                    self.cost = self.cost.saturating_add(mult);
                    if self.cost > self.limits.max_cost {
                        return Err(Exceeded {
                            code: "MAX_COST_EXCEEDED",
                            message: format!(
                                "the operation's estimated cost is above graphql.limits.max_cost ({}; \
                                 each field costs 1 times the assumed sizes of the lists above it, \
                                 graphql.limits.list_size = {})",
                                self.limits.max_cost, self.limits.list_size
                            ),
                        });
                    }
                    let lists = list_depth(f.ty());
                    let mut m = mult;
                    for _ in 0..lists {
                        m = m.saturating_mul(self.limits.list_size.max(1));
                    }
                    if !f.selection_set.selections.is_empty() {
                        self.set(&f.selection_set, depth + 1, m)?;
                    }
                }
                Selection::FragmentSpread(s) => {
                    self.spreads += 1;
                    if self.spreads > self.limits.max_fields {
                        return Err(Exceeded {
                            code: "MAX_FIELDS_EXCEEDED",
                            message: format!(
                                "the operation spreads fragments more often than graphql.limits.max_fields ({})",
                                self.limits.max_fields
                            ),
                        });
                    }
                    if let Some(frag) = self.doc.fragments.get(&s.fragment_name) {
                        self.set(&frag.selection_set, depth, mult)?;
                    }
                }
                Selection::InlineFragment(i) => self.set(&i.selection_set, depth, mult)?,
            }
        }
        Ok(())
    }
}

/// How many lists a type is nested in (`[[Post]]`: 2).
fn list_depth(ty: &apollo_compiler::ast::Type) -> usize {
    let mut n = 0;
    let mut t = ty;
    while t.is_list() {
        n += 1;
        t = t.item_type();
    }
    n
}
