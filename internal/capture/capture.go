// Package capture keeps a durable record of a process's output, beside its bounded ring.
package capture
