"""Writes houses.csv: a generated housing table (deterministic), the regression example's data.

price (in 100k) grows with area and rooms, falls with age and distance to the centre, with noise.
Run: python3 data/make_houses.py > data/houses.csv
"""
import math
import random

rng = random.Random(7)
print("area_m2,rooms,age_years,distance_km,garden,price")
for _ in range(1500):
    area = rng.uniform(30, 220)
    rooms = max(1, round(area / 35 + rng.gauss(0, 0.7)))
    age = rng.uniform(0, 90)
    distance = rng.expovariate(1 / 8)
    garden = 1 if rng.random() < 0.4 else 0
    price = (
        0.9 + 0.021 * area + 0.15 * rooms - 0.008 * age
        + 1.6 * math.exp(-distance / 6) + 0.35 * garden
    ) * math.exp(rng.gauss(0, 0.05))
    print(f"{area:.1f},{rooms},{age:.0f},{distance:.2f},{garden},{price:.3f}")
