//go:build !linux

package atomicfile

import "errors"

// exchange is not offered here: Replace renames twice.
func exchange(a, b string) error { return errors.ErrUnsupported }
