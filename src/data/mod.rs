//! Data files: the provider catalog and the tenants, validated against their
//! declared schemas. Policies reference their attributes by name.

mod catalog;
mod load;
pub mod model;
pub mod schema;
mod tenants;
mod yaml;

pub use load::{ReadWhen, Reading, load, load_reading, load_texts, read_source};
pub use model::*;
pub use tenants::DEFAULT_WORKSPACE;
// For the sim's scenario files; unused (a warning) in a build without the sim.
pub use yaml::FileProblem;
#[cfg(feature = "server")]
pub(crate) use yaml::SpannedMap;
pub(crate) use yaml::{place_of, yaml_error};
