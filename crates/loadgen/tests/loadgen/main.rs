//! Behaviour tests of the load and workload generators, against small servers on 127.0.0.1.

mod loadgen;
mod workload;
