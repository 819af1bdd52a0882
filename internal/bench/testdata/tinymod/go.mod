module example.com/tinymod

go 1.26
