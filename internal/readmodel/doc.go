// Package readmodel holds the read model's pure rules, shared by the
// projection (what a batch of records does to membership periods, seq
// ranges and read markers), delivery (who may see which seq), the
// simulation, and the checkers of the world (the membership periods a
// conversation's events make: LogPeriods): no I/O, no clock.
package readmodel
