#include <cstdio>
int main() { std::puts("atoll: under construction"); return 0; }
