// Package readmodel holds the read model's pure rules, shared by the
// projection (what a batch of records does to membership periods, seq
// ranges and read markers), delivery (who may see which seq) and the
// simulation: no I/O, no clock.
package readmodel
