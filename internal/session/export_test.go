package session

import "github.com/kiln-build/kiln/internal/uptodate"

// TrustRecentInputs lets a test's build record a no-op although its tree
// was written a moment ago; the returned function restores the window.
func TrustRecentInputs() func() {
	old := uptodate.RacyWindow
	uptodate.RacyWindow = 0
	return func() { uptodate.RacyWindow = old }
}

// AnsweredAsNoop says whether a build with opts would be answered from the
// last one's record, without BuildKit.
func AnsweredAsNoop(opts Options, kind string) bool {
	_, _, ok := noopOutcome(opts, kind, headOf(opts))
	return ok
}

// KeptStepTool says whether dir holds a kilnstep kiln would use.
var KeptStepTool = keptStepTool

// BeforeSolve runs f after a build read its inputs and before the daemon
// reads them; the returned function removes it.
func BeforeSolve(f func()) func() {
	testHookBeforeSolve = f
	return func() { testHookBeforeSolve = nil }
}
