"""The apps, the top layer: the Flower ServerApp (server_app.py) and ClientApp (client_app.py), the Hydra entry
point (main.py) with its own Ray (local_ray.py), and the simulation engine's delivery hooks (delivery.py). They
import the strategies and clients; nothing below imports them."""
