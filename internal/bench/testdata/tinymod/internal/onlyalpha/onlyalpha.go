// Package onlyalpha is imported by alpha alone.
package onlyalpha

// Suffix is alpha's own addition.
func Suffix() string { return "(alpha)\n" }
