//go:build !linux

package verbs

func links() ([]Link, error)       { return nil, ErrNotSupported }
func lowerNetdevs(string) []string { return nil }
