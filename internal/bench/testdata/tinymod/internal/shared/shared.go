// Package shared is imported by every binary of the fixture.
package shared

// Greeting is what both binaries print.
func Greeting(name string) string { return "hello from " + name + "\n" }
