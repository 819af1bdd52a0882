package main

import (
	"os"

	"example.com/tinymod/internal/shared"
)

func main() { os.Stdout.WriteString(shared.Greeting("beta")) }
