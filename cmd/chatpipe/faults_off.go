//go:build !chatpipe_faults

package main

// Without the chatpipe_faults build tag the export has no fault point.
var exportBeforeRename func(int)
